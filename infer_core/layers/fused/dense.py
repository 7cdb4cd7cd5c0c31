"""Dense ``y = x W^T + b``: cuBLAS, or our Triton kernels where they measured faster.

The GEMV (``fused/gemv.py``) at decode batches of 1-2 rows; the tensor-core GEMM (``fused/gemm.py``) at
decode batches of ``GEMM_MIN_ROWS``..``GEMM_MAX_ROWS`` rows; cuBLAS between, above, and for prefill.

Shared by the dense linear layers (the ``none`` quantizer) and the LM head, so both pick the kernel by
the same rule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infer_core.layers import fused

GEMV_DTYPES = (torch.bfloat16, torch.float16)
# Triton GEMV 1.11-1.16x cuBLAS at 1-2 rows for Qwen3-0.6B on an H100, <= 1.04x or slower from 4 rows
# (benchmarks/gemv.py: one decode step's projections, CUDA graph, L2 flushed). The kernel takes up to
# fused.gemv.MAX_ROWS = 8 (not imported here: that module imports triton); beyond 2 rows cuBLAS runs.
GEMV_MAX_ROWS = 2
GEMM_MIN_ROWS = 16
GEMM_MAX_ROWS = 256


def use_gemv(impl: fused.FusedImpl, x: torch.Tensor, weight: torch.Tensor, *, off_cuda: bool = False) -> bool:
    """Triton's skinny GEMM for a decode-sized batch of half-precision rows on CUDA; F.linear otherwise.

    ``off_cuda``: on CPU tensors too, in Triton's interpreter (tests of the fused decode path).
    """
    on_triton = fused.use_triton(impl, x) or (off_cuda and impl is fused.FusedImpl.TRITON
                                              and fused.triton_available())
    return (on_triton and x.dtype in GEMV_DTYPES and weight.dtype == x.dtype
            and x.dim() >= 1 and 0 < x.numel() <= GEMV_MAX_ROWS * x.shape[-1] and weight.stride(-1) == 1)


def use_gemm(impl: fused.FusedImpl, x: torch.Tensor, weight: torch.Tensor, *, off_cuda: bool = False) -> bool:
    """Triton's tensor-core GEMM for a large decode batch of half-precision rows on CUDA (the shapes its tiles fit)."""
    on_triton = fused.use_triton(impl, x) or (off_cuda and impl is fused.FusedImpl.TRITON
                                              and fused.triton_available())
    if not (on_triton and x.dtype in GEMV_DTYPES and weight.dtype == x.dtype and x.dim() >= 1
            and weight.dim() == 2 and weight.stride(-1) == 1 and x.shape[-1] > 0):
        return False
    num_rows = x.numel() // x.shape[-1]
    if not GEMM_MIN_ROWS <= num_rows <= GEMM_MAX_ROWS:
        return False
    from infer_core.layers.fused.gemm import choose_config
    from infer_core.layers.fused.gemv import num_sms

    return choose_config(num_rows, weight.shape[0], x.shape[-1], num_sms(x.device)).fits(x.shape[-1])


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 impl: fused.FusedImpl, *, gemm_impl: fused.FusedImpl = fused.FusedImpl.TORCH,
                 after_rms_norm: bool = False, off_cuda: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by the GEMV kernel where :func:`use_gemv` says it is faster.

    Shared by the dense linear layers and the LM head (the same matmul, tied to the embedding or not).
    ``gemm_impl``: TRITON lets the tensor-core GEMM take the rows :func:`use_gemm` gives it.
    ``after_rms_norm``: x is an RMSNorm's output; the GEMV then takes the tiles it has fused with that
    norm (``fused.gemv.config_after_rms_norm``), so fused or not gives the same bits.
    """
    if use_gemv(impl, x, weight, off_cuda=off_cuda):
        from infer_core.layers.fused.gemv import gemv

        return gemv(x, weight, bias, after_rms_norm=after_rms_norm)
    if use_gemm(gemm_impl, x, weight, off_cuda=off_cuda):
        from infer_core.layers.fused.gemm import gemm

        return gemm(x, weight, bias)
    return F.linear(x, weight, bias)
