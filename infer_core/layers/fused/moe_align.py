"""A step's (token, k) entries grouped by expert in blocks of ``BLOCK_M`` (``layers/moe/align.py``'s
``ExpertBlocks``), in one launch: for decode-sized steps, where the torch ops of ``align_by_expert`` would be
some twenty small kernels a layer.

One program does it all, in chunks of entries: it counts each expert's entries, pads every count up to a
multiple of ``BLOCK_M``, fills the slots with the padding value, writes each block's expert, and then (after a
barrier, so the fill lands first) scatters every entry to its slot: its expert's first slot plus the entries of
that expert before it. The result is ``align_by_expert``'s, value for value (entries keep their order within an
expert). The work is entries x experts, so larger steps (prefill) take the torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter
from infer_core.layers.moe.align import ExpertBlocks, max_slots

MAX_ENTRIES = 1024  # above this many entries the torch ops (align_by_expert) group them


@triton.jit
def _onehot(ids_ptr, start, num_entries, EXPERTS: tl.constexpr, CHUNK: tl.constexpr):
    """Entries ``start..start + CHUNK`` against every expert column: ``[CHUNK, EXPERTS]`` of 0/1, and their ids."""
    offs = start + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < num_entries, other=-1).to(tl.int32)
    return (ids[:, None] == tl.arange(0, EXPERTS)[None, :]).to(tl.int32), ids, offs


@triton.jit
def _moe_align_kernel(ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_entries, num_experts, num_slots,
                      BLOCK_M: tl.constexpr, EXPERTS: tl.constexpr, CHUNK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    experts = tl.arange(0, EXPERTS)
    is_expert = experts < num_experts  # an id of num_experts (another rank's expert) takes no slot
    counts = tl.zeros([EXPERTS], dtype=tl.int32)
    for start in range(0, num_entries, CHUNK):
        onehot, _, _ = _onehot(ids_ptr, start, num_entries, EXPERTS, CHUNK)
        counts += tl.sum(onehot, axis=0)
    padded = tl.where(is_expert, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    ends = tl.cumsum(padded, axis=0)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    for start in range(0, num_slots, CHUNK):
        slots = start + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + slots, tl.zeros([CHUNK], dtype=tl.int32) + num_entries, mask=slots < num_slots)
    num_blocks = num_slots // BLOCK_M
    for start in range(0, num_blocks, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        # the expert whose padded group holds the block's first slot: how many groups end at or before it
        ended = (ends[None, :] <= (blocks * BLOCK_M)[:, None]) & is_expert[None, :]
        expert = tl.minimum(tl.sum(ended.to(tl.int32), axis=1), num_experts - 1)
        tl.store(expert_ids_ptr + blocks, expert, mask=blocks < num_blocks)
    tl.debug_barrier()  # every fill above is written before any entry below overwrites its slot
    next_slot = ends - padded  # each expert's next free slot
    for start in range(0, num_entries, CHUNK):
        onehot, ids, offs = _onehot(ids_ptr, start, num_entries, EXPERTS, CHUNK)
        earlier = tl.cumsum(onehot, axis=0) - onehot  # entries of the same expert before it in this chunk
        slot = tl.sum(onehot * (next_slot[None, :] + earlier), axis=1)
        keep = (offs < num_entries) & (ids >= 0) & (ids < num_experts)
        tl.store(sorted_ids_ptr + slot, offs, mask=keep)
        next_slot += tl.sum(onehot, axis=0)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """``align_by_expert(topk_ids, num_experts, block_m)`` in one launch (at most ``MAX_ENTRIES`` entries)."""
    num_entries = topk_ids.numel()
    if num_entries > MAX_ENTRIES:
        raise ValueError(f"moe_align takes at most {MAX_ENTRIES} entries, got {num_entries}: use align_by_expert")
    ids = topk_ids.reshape(-1)
    num_slots = max_slots(num_entries, num_experts, block_m)
    device = topk_ids.device
    sorted_ids = torch.empty(num_slots, dtype=torch.int32, device=device)
    expert_ids = torch.empty(num_slots // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    experts = triton.next_power_of_2(num_experts)
    pdl = use_pdl(ids)
    _moe_align_kernel[(1,)](ids, sorted_ids, expert_ids, num_padded, num_entries, num_experts, num_slots,
                            BLOCK_M=block_m, EXPERTS=experts, CHUNK=max(16, min(64, 4096 // experts)), USE_PDL=pdl,
                            launch_pdl=pdl, num_warps=4)
    return ExpertBlocks(sorted_ids, expert_ids, num_padded, block_m)
