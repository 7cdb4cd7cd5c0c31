"""Experts with 8-bit weights: ``INFER_QUANTIZATION=int8`` / ``fp8`` on a mixture-of-experts model.

Each expert's ``gate_up_proj`` [2I, H] and ``down_proj`` [H, I] are quantized row by row while they load (one
float32 scale a row, symmetric, as the linear layers' per-channel weights: ``quantize.quantize_weight``), so no
expert is ever held in the model dtype beside its 8-bit copy. The activations stay in the model dtype (weight-only:
the experts of a decode step are read, and reading half the bytes is the gain; the router, which chooses them,
stays dense too): the core's grouped GEMMs convert each 8-bit tile to the activations' dtype, which holds int8's
and e4m3's values exactly, and multiply the float32 sums by the rows' scales (``fused/moe_gemm.py``), and at a
token or two its GEMVs over the entries do the same in float32 (``fused/moe_gemv.py``); the torch path (the CPU's,
and the reference) computes the same sums (``experts_torch`` with scales).

Under expert parallelism a rank quantizes its own whole experts, so its rows and scales are those one GPU holds;
under tensor parallelism each rank quantizes its slice of every expert (gate_up's rows keep their scales, down's
rows are scaled over the rank's columns).
"""

from __future__ import annotations

import torch
from infer_core.interfaces import MoEMethod
from infer_core.layers import fused
from infer_core.layers.moe.unquantized import MOE_GEMM_DTYPES, run_experts
from torch import nn

from infer_quant_w8a8.quantize import TORCH_DTYPES, quantize_weight
from infer_quant_w8a8.schemes import QuantDtype, WeightFormat

SCALES = {"gate_up_proj": "gate_up_scale", "down_proj": "down_scale"}


class W8ExpertsMethod(MoEMethod):
    """Every expert's weights as int8 or float8 e4m3 with per-row float32 scales, quantized while loading."""

    def __init__(self, dtype: QuantDtype) -> None:
        self.weight_format = WeightFormat(dtype)
        self.triton = False

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size, params_dtype):
        qdtype = TORCH_DTYPES[self.weight_format.dtype]
        for name, shape in (("gate_up_proj", (num_experts, 2 * intermediate_size, hidden_size)),
                            ("down_proj", (num_experts, hidden_size, intermediate_size))):
            layer.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=qdtype), requires_grad=False))
            layer.register_buffer(SCALES[name], torch.ones(shape[:2], dtype=torch.float32))
        self.triton = params_dtype in MOE_GEMM_DTYPES and fused.runs_triton(fused.MOE, layer.gate_up_proj.device)

    def load_weight(self, layer, param, loaded, expert, row_offset):
        """Quantize one expert's rows (its own scales, one a row) into ``param[expert]`` from ``row_offset``."""
        dst = param.data[expert].narrow(0, row_offset, loaded.shape[0])
        if dst.shape != loaded.shape:
            raise ValueError(f"expert weight shape {tuple(loaded.shape)} does not fit parameter slice "
                             f"{tuple(dst.shape)}")
        if not loaded.is_floating_point() or loaded.element_size() == 1:
            raise ValueError(f"expert weights of {loaded.dtype} cannot be quantized to "
                             f"{self.weight_format.dtype.value} while loading: give the unquantized checkpoint "
                             "(float16, bfloat16 or float32)")
        q, scale = quantize_weight(loaded.to(dst.device), self.weight_format)
        dst.copy_(q)
        name = "gate_up_proj" if param is layer.gate_up_proj else "down_proj"
        getattr(layer, SCALES[name])[expert].narrow(0, row_offset, loaded.shape[0]).copy_(scale[:, 0])

    def apply(self, layer, x, topk_weights, topk_ids):
        return run_experts(layer, x, topk_weights, topk_ids, triton=self.triton, gate_up_scale=layer.gate_up_scale,
                           down_scale=layer.down_scale)
