"""Dense ``x @ W^T + b`` on the CPU with the weight packed once, after it is loaded.

``F.linear`` on the CPU reorders the weight into the GEMM's blocked layout on every call; packing it once leaves
only the GEMM. Two packings, chosen per weight by :func:`pack`:

- bfloat16 on a CPU with AMX (and K a multiple of 32): our AMX kernel's tile order (``cpu_amx.py``), which reads
  the weights up to twice as fast as oneDNN's packed GEMM at decode sizes and is no slower up to
  ``AMX_MAX_ROWS`` rows. Above that (the longest prefill chunks, compute-bound, where oneDNN's blocking is faster
  than the kernel's) oneDNN's GEMM runs on the plain weight: it reorders the weight per call, a small share of
  such a GEMM, and the weights are held twice (the parameter and the tiles), as with oneDNN's packing.
- otherwise oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what Inductor's freezing does),
  which oneDNN runs on AVX-512 (or AMX for bfloat16).

Layers whose weight is on the CPU in a dtype one of them packs choose it when they are built (``packs``) and pack
after the load (``pack``); the original weight stays the parameter (checkpoint names, the tied embedding).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from infer_core.layers import cpu_amx

# The batch size oneDNN's packed layout is chosen for: the decode batches of a CPU engine. Any other number of
# rows is correct too (oneDNN takes the packed weight for every M).
PACK_BATCH_HINT = 32
# Rows up to which the AMX kernel runs a bfloat16 GEMM (benchmarks/results/cpu-amx-gemm-2026-11-28/)
AMX_MAX_ROWS = 1024


@dataclass(frozen=True)
class PackedWeight:
    """A weight [N, K] packed for one of the two GEMMs (``tiles``: the AMX kernel's, else oneDNN's), and the plain
    weight it was packed from (the AMX path's large-row GEMMs)."""

    data: torch.Tensor
    weight: torch.Tensor
    tiles: bool


@functools.cache
def _onednn_packs(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def packs(weight: torch.Tensor) -> bool:
    """Whether a layer with this weight (its device and dtype, when built) runs a packed GEMM."""
    return weight.device.type == "cpu" and _onednn_packs(weight.dtype)


def pack(weight: torch.Tensor) -> PackedWeight:
    """``weight`` [N, K] packed for :func:`packed_linear`: in AMX tile order where the kernel takes it, else in
    oneDNN's blocked layout."""
    weight = weight.detach()
    if cpu_amx.takes(weight):
        return PackedWeight(cpu_amx.pack(weight), weight, tiles=True)
    return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT), weight,
                        tiles=False)


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` by the weight ``pack`` made; x [..., K] in the weight's dtype."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if not packed.tiles:
        out = torch.ops.mkldnn._linear_pointwise(rows, packed.data, bias, "none", [], "")
    elif rows.shape[0] <= AMX_MAX_ROWS:
        out = cpu_amx.linear(rows, packed.data, packed.weight.shape[0], bias)
    else:
        out = F.linear(rows, packed.weight, bias)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])
