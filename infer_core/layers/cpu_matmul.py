"""Dense ``x @ W^T + b`` on the CPU with the weight packed once, after it is loaded.

``F.linear`` on the CPU reorders the weight into the GEMM's blocked layout on every call; packing it once leaves
only the GEMM. :func:`pack` picks one packing per weight:

- bfloat16 on a CPU with AMX (K a multiple of 32): our AMX kernel's tile order (``cpu_amx.py``);
- float32 on a CPU with AVX-512: our AVX-512 kernel's order (``cpu_f32_gemm.py``);
- otherwise oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what Inductor's freezing does).

Our kernels run the decode-sized GEMMs, where they are faster than oneDNN's packed GEMM
(``benchmarks/results/cpu-amx-gemm-2026-11-28/``): up to ``MAX_ROWS[kind]`` rows. Above that (prefill chunks,
compute-bound, where oneDNN's blocking is as fast or faster) oneDNN's GEMM runs on the plain weight: it reorders
the weight per call, a small share of such a GEMM, and the weights are held twice (the parameter and one packed
copy), as with oneDNN's packing alone.

Layers whose weight is on the CPU in a dtype one of them packs choose it when they are built (``packs``) and pack
after the load (``pack``); the original weight stays the parameter (checkpoint names, the tied embedding).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from infer_core.layers import cpu_amx, cpu_f32_gemm

# The batch size oneDNN's packed layout is chosen for: the decode batches of a CPU engine. Any other number of
# rows is correct too (oneDNN takes the packed weight for every M).
PACK_BATCH_HINT = 32
# Our kernels, and the rows up to which each runs a GEMM (benchmarks/results/cpu-amx-gemm-2026-11-28/)
KERNELS = {"amx": cpu_amx, "f32": cpu_f32_gemm}
MAX_ROWS = {"amx": 1024, "f32": 64}


@dataclass(frozen=True)
class PackedWeight:
    """A weight [N, K] packed for one GEMM (``kind``: a key of ``KERNELS``, or ``"onednn"``), and the plain weight
    it was packed from (our kernels' large-row GEMMs)."""

    data: torch.Tensor
    weight: torch.Tensor
    kind: str


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
    """``weight`` [N, K] packed for :func:`packed_linear`: for our kernel where one takes it, else for oneDNN."""
    weight = weight.detach()
    for kind, kernel in KERNELS.items():
        if kernel.takes(weight):
            return PackedWeight(kernel.pack(weight), weight, kind)
    return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT), weight,
                        "onednn")


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` by the weight ``pack`` made; x [..., K] in the weight's dtype."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    kind = packed.kind
    if kind == "onednn":
        out = torch.ops.mkldnn._linear_pointwise(rows, packed.data, bias, "none", [], "")
    elif rows.shape[0] <= MAX_ROWS[kind]:
        out = KERNELS[kind].linear(rows, packed.data, packed.weight.shape[0], bias)
    else:
        out = F.linear(rows, packed.weight, bias)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])
