"""The ``none`` quantizer: dense weights in the model dtype, ``F.linear`` (our GEMV kernel at decode sizes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.interfaces import LinearMethod, Quantizer
from infer_core.layers import fused

GEMV_DTYPES = (torch.bfloat16, torch.float16)
GEMV_MAX_ROWS = 8  # infer_core.layers.fused.gemv.MAX_ROWS (not imported here: that module imports triton)


class UnquantizedLinearMethod(LinearMethod):
    def __init__(self) -> None:
        self.impl = fused.GEMV  # read when the layer is built, like the other fused ops; set it per instance

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        weight.output_dim = 0
        weight.input_dim = 1
        layer.register_parameter("weight", weight)

    def apply(self, layer, x, bias):
        if self.use_gemv(x, layer.weight):
            from infer_core.layers.fused.gemv import gemv

            return gemv(x, layer.weight, bias)
        return F.linear(x, layer.weight, bias)

    def use_gemv(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Triton's skinny GEMM for a decode-sized batch of half-precision rows on CUDA; F.linear otherwise."""
        return (fused.use_triton(self.impl, x) and x.dtype in GEMV_DTYPES and weight.dtype == x.dtype
                and x.dim() >= 1 and 0 < x.numel() <= GEMV_MAX_ROWS * x.shape[-1] and weight.stride(-1) == 1)


class NoQuantizer(Quantizer):
    """Every layer dense."""

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return UnquantizedLinearMethod()
