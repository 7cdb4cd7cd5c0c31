"""Dense ``y = x W^T + b``: cuBLAS, or our Triton GEMV where it measured faster (decode batches of 1-2 rows).

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


def use_gemv(impl: fused.FusedImpl, x: torch.Tensor, weight: torch.Tensor, *, off_cuda: bool = False) -> bool:
    """Triton's skinny GEMM for a decode-sized batch of half-precision rows on CUDA; F.linear otherwise.

    ``off_cuda``: on CPU tensors too, in Triton's interpreter (tests of the fused decode path).
    """
    on_triton = fused.use_triton(impl, x) or (off_cuda and impl is fused.FusedImpl.TRITON
                                              and fused.triton_available())
    return (on_triton and x.dtype in GEMV_DTYPES and weight.dtype == x.dtype
            and x.dim() >= 1 and 0 < x.numel() <= GEMV_MAX_ROWS * x.shape[-1] and weight.stride(-1) == 1)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 impl: fused.FusedImpl, *, after_rms_norm: bool = False, before_silu: bool = False,
                 off_cuda: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by the GEMV kernel where :func:`use_gemv` says it is faster.

    Shared by the dense linear layers and the LM head (the same matmul, tied to the embedding or not).
    ``after_rms_norm``: x is an RMSNorm's output; the GEMV then takes the tiles it has fused with that
    norm (``fused.gemv.config_after_rms_norm``; ``before_silu``: gate_up's, followed by SiLU-and-mul), so
    fused or not gives the same bits.
    """
    if use_gemv(impl, x, weight, off_cuda=off_cuda):
        from infer_core.layers.fused.gemv import gemv

        return gemv(x, weight, bias, after_rms_norm=after_rms_norm, before_silu=before_silu)
    return F.linear(x, weight, bias)
