"""Dense ``x @ W^T + b`` on the CPU through oneDNN with the weight packed once, after it is loaded.

``F.linear`` on the CPU reorders the weight into the GEMM's blocked layout on every call; packing it once
(``torch.ops.mkldnn._reorder_linear_weight``, what Inductor's freezing does) leaves only the GEMM, which
oneDNN runs on AMX tiles where the CPU has them (bfloat16) and AVX-512 otherwise. Layers whose weight is on
the CPU in a dtype oneDNN packs choose it when they are built (``packs``) and pack after the load
(``pack``); the original weight stays the parameter (checkpoint names, the tied embedding).
"""

from __future__ import annotations

import functools

import torch

# The batch size the packed layout is chosen for: the decode batches of a CPU engine. Any other number of
# rows is correct too (oneDNN takes the packed weight for every M).
PACK_BATCH_HINT = 32


@functools.cache
def _onednn_packs(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def packs(weight: torch.Tensor) -> bool:
    """Whether a layer with this weight (its device and dtype, when built) runs the packed GEMM."""
    return weight.device.type == "cpu" and _onednn_packs(weight.dtype)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] in oneDNN's blocked layout for :func:`packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_BATCH_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` by the weight ``pack`` made; x [..., K] in the weight's dtype."""
    if x.dim() == 2:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])
