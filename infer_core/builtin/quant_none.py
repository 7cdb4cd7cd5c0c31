"""The ``none`` quantizer: dense weights in the model dtype, ``F.linear`` (our GEMV kernel at decode sizes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.interfaces import LinearMethod, Quantizer
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


class UnquantizedLinearMethod(LinearMethod):
    def __init__(self) -> None:
        self.impl = fused.GEMV  # read when the layer is built, like the other fused ops; set it per instance

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        weight.output_dim = 0
        weight.input_dim = 1
        layer.register_parameter("weight", weight)

    def apply(self, layer, x, bias):
        return dense_linear(x, layer.weight, bias, self.impl)


class NoQuantizer(Quantizer):
    """Every layer dense."""

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return UnquantizedLinearMethod()
