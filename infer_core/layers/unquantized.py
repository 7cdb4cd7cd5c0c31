"""The dense LinearMethod: weights in the model dtype, ``F.linear``, our Triton GEMV at decode sizes (CUDA), or
a GEMM on a weight packed once after the load (the CPU: AMX tiles or oneDNN, ``cpu_matmul.py``).

The ``none`` quantizer gives every layer one (``builtin/quant_none.py``). It lives with the layers because
they fuse it with its neighbours: an RMSNorm before it and SiLU-and-mul after it run in its GEMV launch
(``fused/gemv_fusion.py``), which needs the dense weight as this method stores it.
"""

from __future__ import annotations

import torch
from torch import nn

from infer_core.interfaces import LinearMethod
from infer_core.layers import cpu_matmul, fused
from infer_core.layers.fused.dense import GEMV_DTYPES, dense_linear, use_gemv
from infer_core.layers.fused.gemv_fusion import decode_sized, dense_fuses_input_norm, norm_gemv


class UnquantizedLinearMethod(LinearMethod):
    """``x @ W^T + b`` with ``W`` [sum(output_sizes), input_size] in the model dtype.

    Chosen when the weights are created, from the layer being built: whether the GEMV runs at decode sizes
    (the weight's device and dtype, ``fused.runs_triton``), and its tiles: where the layer's input is an
    RMSNorm's output (``layer.after_rms_norm``) those the GEMV has fused with that norm, and where its
    ``[gate; up]`` output goes to SiLU-and-mul (``layer.act``) those fused with that too, so a layer gives
    the same bits whether the fused launch or this method runs it. On the CPU, where a packed GEMM takes the
    weight's dtype (``cpu_matmul.packs``), the weight is packed once after the load and every call runs that
    GEMM on the packed copy (AMX tiles for bfloat16 where the CPU has them, else oneDNN's).
    """

    def __init__(self) -> None:
        self.gemv = False
        self.after_rms_norm = False
        self.before_silu = False
        self.packs = False
        self.packed: cpu_matmul.PackedWeight | None = None  # the CPU's packed weight, once loaded

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        weight.output_dim = 0
        weight.input_dim = 1
        layer.register_parameter("weight", weight)
        self.gemv = params_dtype in GEMV_DTYPES and fused.runs_triton(fused.GEMV, weight.device)
        self.packs = not self.gemv and cpu_matmul.packs(weight)  # the interpreted GEMV of the tests keeps its path
        self.after_rms_norm = bool(getattr(layer, "after_rms_norm", False))
        self.before_silu = getattr(layer, "act", None) is not None

    def process_after_load(self, layer) -> None:
        if self.packs:
            self.packed = cpu_matmul.pack(layer.weight)

    def uses_gemv(self, layer, x: torch.Tensor) -> bool:
        """Whether ``apply`` runs our GEMV kernel on ``x`` (a layer built for it, a decode-sized batch)."""
        return self.gemv and use_gemv(x, layer.weight)

    def fuses_input_norm(self, layer, norm) -> bool:
        """Where the norm, this GEMV and the activation would each run our kernels (``fused/gemv_fusion.py``)."""
        return dense_fuses_input_norm(norm, layer)

    def apply_with_norm(self, layer, normed, bias, keep_normed=False):
        """At 1-2 rows, ``fused/norm_gemv.py``'s launch: the bits of the norm, GEMV and SiLU-and-mul kernels."""
        if not decode_sized(normed):
            return None
        if not keep_normed:
            return norm_gemv(normed, layer, bias)
        rows = torch.empty(normed.x.shape, dtype=normed.x.dtype, device=normed.x.device)
        return norm_gemv(normed, layer, bias, rows), rows

    def apply(self, layer, x, bias):
        if self.packed is not None:
            return cpu_matmul.packed_linear(x, self.packed, bias)
        return dense_linear(x, layer.weight, bias, self.gemv, after_rms_norm=self.after_rms_norm,
                            before_silu=self.before_silu)
