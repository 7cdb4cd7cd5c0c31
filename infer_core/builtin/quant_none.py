"""The ``none`` quantizer: dense weights in the model dtype, ``F.linear`` (our GEMV kernel at decode sizes)."""

from __future__ import annotations

import torch
from torch import nn

from infer_core.interfaces import LinearMethod, Quantizer
from infer_core.layers import fused
from infer_core.layers.fused.dense import dense_linear, use_gemv


class UnquantizedLinearMethod(LinearMethod):
    def __init__(self) -> None:
        self.impl = fused.GEMV  # read when the layer is built, like the other fused ops; set it per instance
        # Set by the model where an RMSNorm's output is this layer's input (qkv, gate_up: see
        # layers/fused/gemv_fusion.py): the GEMV then runs with the tiles it has fused with that norm.
        self.after_rms_norm = False
        self.before_silu = False  # and its [gate; up] output goes to SiLU-and-mul (gate_up)
        self.force_triton = False  # tests: the GEMV on CPU tensors too (Triton's interpreter)

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        weight.output_dim = 0
        weight.input_dim = 1
        layer.register_parameter("weight", weight)

    def uses_gemv(self, layer, x: torch.Tensor) -> bool:
        """Whether ``apply`` runs our GEMV kernel for this x (else F.linear)."""
        return use_gemv(self.impl, x, layer.weight, off_cuda=self.force_triton)

    def apply(self, layer, x, bias):
        return dense_linear(x, layer.weight, bias, self.impl, after_rms_norm=self.after_rms_norm,
                            before_silu=self.before_silu, off_cuda=self.force_triton)


class NoQuantizer(Quantizer):
    """Every layer dense."""

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return UnquantizedLinearMethod()
