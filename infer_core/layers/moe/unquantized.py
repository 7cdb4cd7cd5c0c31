"""The dense MoEMethod: every expert's weights in the model dtype, run by the grouped-GEMM kernels or by torch.

The ``none`` quantizer gives every expert layer one (``builtin/quant_none.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.interfaces import MoEMethod
from infer_core.layers import fused
from infer_core.layers.moe.align import align_by_expert

# The dtypes the grouped-GEMM kernels take (tl.dot of float32 runs in IEEE precision, not TF32).
MOE_GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def experts_torch(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, gate_up_scale: torch.Tensor | None = None,
                  down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with ``e = topk_ids[t, k]``.

    One expert at a time, in increasing order, for the tokens routed to it (as HF transformers' eager experts
    do): each expert's weighted output is added in ``x``'s dtype. Ids from ``len(gate_up)`` on are experts of
    other ranks and add nothing. Reads the routing on the host (a sync per layer): the CPU's path, and the
    reference the kernels are checked against. With ``gate_up_scale`` [E, 2I] and ``down_scale`` [E, H] the
    weights are 8-bit and each row's products are summed in float32, then multiplied by the row's scale and
    rounded to ``x``'s dtype (the kernels keep gate and up in float32 to the SiLU and round once: in float32 the
    two agree to rounding, in bfloat16 within its precision).
    """
    out = torch.zeros_like(x)
    num_experts = gate_up.shape[0]
    for expert in torch.unique(topk_ids).tolist():
        if expert >= num_experts:
            continue
        tokens, slot = torch.where(topk_ids == expert)
        gate, up = _rows_times(x[tokens], gate_up[expert], gate_up_scale, expert).chunk(2, dim=-1)
        y = _rows_times(F.silu(gate) * up, down[expert], down_scale, expert)
        # a token meets an expert at most once, so this is out[tokens] += ... (index_add_ is far slower on the CPU)
        out.index_put_((tokens,), (y * topk_weights[tokens, slot, None]).to(x.dtype), accumulate=True)
    return out


def _rows_times(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, expert: int) -> torch.Tensor:
    """``x @ w^T``, or for 8-bit ``w`` ``(x @ w^T) * scale[expert]`` from float32 sums, in ``x``'s dtype."""
    if scale is None:
        return F.linear(x, w)
    return (F.linear(x.float(), w.float()) * scale[expert]).to(x.dtype)


class UnquantizedMoEMethod(MoEMethod):
    """Experts stacked as ``gate_up_proj`` [experts, 2 x intermediate, hidden] (each expert's gate rows, then its
    up rows) and ``down_proj`` [experts, hidden, intermediate], in the model dtype.

    The kernel is chosen when the weights are created, from the device they are created on (``fused.runs_triton``):
    the grouped GEMMs (``fused/moe_gemm.py``, the entries grouped by expert in one launch, ``fused/moe_align.py``),
    or at decode sizes two GEMV launches over the entries (``fused/moe_gemv.py``), neither with a host sync, so
    decode steps replay as CUDA graphs; or :func:`experts_torch`.
    """

    def __init__(self) -> None:
        self.triton = False

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size, params_dtype):
        for name, shape in (("gate_up_proj", (num_experts, 2 * intermediate_size, hidden_size)),
                            ("down_proj", (num_experts, hidden_size, intermediate_size))):
            layer.register_parameter(name, nn.Parameter(torch.empty(shape, dtype=params_dtype), requires_grad=False))
        self.triton = params_dtype in MOE_GEMM_DTYPES and fused.runs_triton(fused.MOE, layer.gate_up_proj.device)

    def apply(self, layer, x, topk_weights, topk_ids):
        return run_experts(layer, x, topk_weights, topk_ids, triton=self.triton)


def run_experts(layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *, triton: bool,
                gate_up_scale: torch.Tensor | None = None, down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's experts (``gate_up_proj``, ``down_proj``; 8-bit with their rows' scales) on ``x``: with ``triton``
    the GEMVs over the entries at decode sizes, else the grouped GEMMs; without, :func:`experts_torch`."""
    scales = {"gate_up_scale": gate_up_scale, "down_scale": down_scale}
    if not triton:
        return experts_torch(x, layer.gate_up_proj, layer.down_proj, topk_weights, topk_ids, **scales)
    from infer_core.layers.fused.moe_gemv import moe_gemv_experts, use_moe_gemv

    if use_moe_gemv(topk_ids.shape[0], topk_ids.shape[1], layer.num_experts):  # decode: a read of the experts
        return moe_gemv_experts(x, layer.gate_up_proj, layer.down_proj, topk_weights, topk_ids, **scales)
    return grouped_experts(layer, x, topk_weights, topk_ids, **scales)


def tiles_for(layer, num_entries: int):
    """The grouped GEMMs' tiles for ``num_entries`` entries handed to ``layer``: by the model's expert count, not
    the rank's (``fused.moe_gemm.choose_tiles``)."""
    from infer_core.layers.fused.moe_gemm import choose_tiles

    return choose_tiles(num_entries, layer.num_experts)


def grouped_experts(layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    gate_up_scale: torch.Tensor | None = None, down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's experts (``gate_up_proj``, ``down_proj``; 8-bit with their rows' scales) on the grouped GEMMs:
    the entries grouped by expert, in one launch at decode sizes, in blocks of the tiles' rows."""
    from infer_core.layers.fused import moe_align
    from infer_core.layers.fused.moe_gemm import fused_experts

    num_experts = layer.gate_up_proj.shape[0]
    tiles = tiles_for(layer, topk_ids.numel())
    if topk_ids.numel() <= moe_align.MAX_ENTRIES:  # one launch; prefill-sized steps take the torch ops
        blocks = moe_align.moe_align(topk_ids, num_experts, tiles.block_m)
    else:
        blocks = align_by_expert(topk_ids, num_experts, tiles.block_m)
    drops = layer.num_local_experts < layer.num_experts
    return fused_experts(x, layer.gate_up_proj, layer.down_proj, topk_weights, blocks, tiles,
                         local_ids=topk_ids if drops else None, gate_up_scale=gate_up_scale, down_scale=down_scale)
