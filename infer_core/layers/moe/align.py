"""A step's (token, k) entries sorted by expert into blocks of one expert each, for the grouped GEMMs.

Entry ``e = t * top_k + k`` is token ``t``'s ``k``-th expert. The grouped GEMM kernels (``fused/moe_gemm.py``)
give every block of ``block_m`` slots to one program row, so each expert's entries are padded up to a multiple
of ``block_m`` with the entry count (a row nobody reads or writes). Everything is computed on the device with
shapes fixed by the entry count (no host sync), so a CUDA graph captures it and replays it for any routing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ExpertBlocks:
    """The entries of one step grouped by expert.

    ``sorted_ids`` [num_slots] int32: entry ids, expert by expert, each expert's group padded to a multiple of
    ``block_m`` with ``num_entries``; ``expert_ids`` [num_slots // block_m] int32: the expert of each block;
    ``num_padded`` [1] int32: the slots in use (blocks from there on hold no entry, and their expert is
    meaningless). ``num_slots`` is :func:`max_slots`, the most the entries can need.
    """

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_padded: torch.Tensor
    block_m: int


def max_slots(num_entries: int, num_experts: int, block_m: int) -> int:
    """Slots enough for any routing: each of at most ``min(entries, experts)`` groups pads fewer than
    ``block_m`` slots; rounded up to a whole block."""
    active = min(num_entries, num_experts)
    return -(-(num_entries + active * (block_m - 1)) // block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """Group the entries of ``topk_ids`` [tokens, top_k] by expert in blocks of ``block_m``.

    An id equal to ``num_experts`` (an expert this rank does not hold) is left out: no slot holds its entry.
    Within an expert, entries keep their order.
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_entries, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded[num_experts:].zero_()  # the left-out entries take no slots (a fill on the device: capturable)
    ends = padded.cumsum(0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first_of_group = counts.cumsum(0) - counts  # where each expert's entries begin in ``order``
    rank_in_group = torch.arange(num_entries, device=device) - first_of_group[sorted_experts]
    num_slots = max_slots(num_entries, num_experts, block_m)
    # left-out entries go to one slot past the end, cut off below
    dest = torch.where(sorted_experts < num_experts, starts[sorted_experts] + rank_in_group, num_slots)
    sorted_ids = torch.full((num_slots + 1,), num_entries, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, num_slots, block_m, device=device)
    expert_ids = torch.searchsorted(ends[:num_experts], block_starts, right=True).clamp_(max=num_experts - 1)
    return ExpertBlocks(sorted_ids[:num_slots], expert_ids.to(torch.int32), ends[num_experts:].to(torch.int32),
                        block_m)
