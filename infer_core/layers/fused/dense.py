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


def use_gemv(impl: fused.FusedImpl, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Triton's skinny GEMM for a decode-sized batch of half-precision rows on CUDA; F.linear otherwise."""
    return (fused.use_triton(impl, x) and x.dtype in GEMV_DTYPES and weight.dtype == x.dtype
            and x.dim() >= 1 and 0 < x.numel() <= GEMV_MAX_ROWS * x.shape[-1] and weight.stride(-1) == 1)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 impl: fused.FusedImpl) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by the GEMV kernel where :func:`use_gemv` says it is faster.

    Shared by the dense linear layers and the LM head (the same matmul, tied to the embedding or not).
    """
    if use_gemv(impl, x, weight):
        from infer_core.layers.fused.gemv import gemv

        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)
