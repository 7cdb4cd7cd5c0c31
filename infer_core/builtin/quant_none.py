"""The ``none`` quantizer: dense weights in the model dtype, ``F.linear``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.interfaces import LinearMethod, Quantizer


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        weight.output_dim = 0
        weight.input_dim = 1
        layer.register_parameter("weight", weight)

    def apply(self, layer, x, bias):
        return F.linear(x, layer.weight, bias)


class NoQuantizer(Quantizer):
    """Every layer dense."""

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return UnquantizedLinearMethod()
