"""A step's (token, k) entries grouped by expert in blocks of ``BLOCK_M`` (``layers/moe/align.py``'s
``ExpertBlocks``), in one launch: for decode-sized steps, where the torch ops of ``align_by_expert`` would be
some twenty small kernels a layer.

Every program reads every entry's expert (at most ``MAX_ENTRIES``, at most 16 KB, from L2) and histograms them twice:
all of them, which gives each expert's count, padded group and first slot, and those before its own chunk of
entries, which gives where its entries of each expert start. It then writes its share of the output with no
program waiting on another: its chunk's entries, each to its expert's first slot plus the entries of that
expert before it (so entries keep their order within an expert), and its share of the blocks, each block's
expert and the padding value in each of its slots past the expert's entries. So the slots an entry fills and
those padded are disjoint and the result is ``align_by_expert``'s, value for value. One program per chunk, so the
in-chunk ranking (a ``[chunk, experts]`` tile) and the padding run side by side rather than one chunk after
another; the tiles shrink as the experts grow, so a program's registers stay bounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter
from infer_core.layers.moe.align import ExpertBlocks, max_slots

MAX_ENTRIES = 4096  # above this many entries (prefill-sized steps) the torch ops (align_by_expert) group them;
# decode batches of up to 512 tokens at top-8 stay in the one launch, where the torch ops would sort
TILE = 16384  # the most one-hot elements a program holds: its chunk of entries (or blocks) x the experts


def align_tiles(num_experts: int) -> tuple[int, int, int]:
    """``(EXPERTS, CHUNK, BLOCKS)``: the experts' power of two, the entries a program places (at most 128) and the
    blocks it describes (at most 32), each times ``EXPERTS`` within ``TILE``."""
    experts = triton.next_power_of_2(num_experts)
    return experts, max(16, min(128, TILE // experts)), max(4, min(32, TILE // 2 // experts))


@triton.jit
def _moe_align_kernel(ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_entries, num_experts, num_slots,
                      BLOCK_M: tl.constexpr, EXPERTS: tl.constexpr, ENTRIES: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCKS: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    pid = tl.program_id(0)
    experts = tl.arange(0, EXPERTS)
    # every entry's expert; an id of num_experts or more (another rank's expert) takes no slot
    offs = tl.arange(0, ENTRIES)
    ids = tl.load(ids_ptr + offs, mask=offs < num_entries, other=num_experts).to(tl.int32)
    routed = (offs < num_entries) & (ids >= 0) & (ids < num_experts)
    counts = tl.histogram(ids, EXPERTS, mask=routed)
    before = tl.histogram(ids, EXPERTS, mask=routed & (offs < pid * CHUNK))  # of each expert, before this chunk
    padded = tl.where(experts < num_experts, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    if pid == 0:
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))

    # this program's chunk of entries, each to its expert's next slot
    mine = pid * CHUNK + tl.arange(0, CHUNK)
    my_ids = tl.load(ids_ptr + mine, mask=mine < num_entries, other=-1).to(tl.int32)
    onehot = (my_ids[:, None] == experts[None, :]).to(tl.int32)
    earlier = tl.cumsum(onehot, axis=0) - onehot  # entries of the same expert before it in this chunk
    slot = tl.sum(onehot * (starts + before)[None, :] + onehot * earlier, axis=1)
    keep = (mine < num_entries) & (my_ids >= 0) & (my_ids < num_experts)
    tl.store(sorted_ids_ptr + slot, mine, mask=keep)

    # this program's blocks: each one's expert (the group holding its first slot: how many groups end at or
    # before it), and the padding value in its slots past that expert's entries
    blocks = pid * BLOCKS + tl.arange(0, BLOCKS)
    num_blocks = num_slots // BLOCK_M
    ended = (ends[None, :] <= (blocks * BLOCK_M)[:, None]) & (experts < num_experts)[None, :]
    expert = tl.minimum(tl.sum(ended.to(tl.int32), axis=1), num_experts - 1)
    tl.store(expert_ids_ptr + blocks, expert, mask=blocks < num_blocks)
    is_expert = (expert[:, None] == experts[None, :]).to(tl.int32)
    first = tl.sum(is_expert * starts[None, :], axis=1)
    filled = tl.sum(is_expert * counts[None, :], axis=1)  # the expert's entries, from its first slot on
    slots = blocks[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    pad = (slots - first[:, None] >= filled[:, None]) & (blocks < num_blocks)[:, None]
    tl.store(sorted_ids_ptr + slots, tl.zeros([BLOCKS, BLOCK_M], dtype=tl.int32) + num_entries, mask=pad)


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
    num_padded = torch.zeros(1, dtype=torch.int32, device=device)
    if num_entries == 0:  # no slot, no block: nothing to launch
        return ExpertBlocks(sorted_ids, expert_ids, num_padded, block_m)
    experts, chunk, blocks = align_tiles(num_experts)
    grid = max(triton.cdiv(num_entries, chunk), triton.cdiv(num_slots // block_m, blocks))
    pdl = use_pdl(ids)
    _moe_align_kernel[(grid,)](ids, sorted_ids, expert_ids, num_padded, num_entries, num_experts, num_slots,
                               BLOCK_M=block_m, EXPERTS=experts, ENTRIES=triton.next_power_of_2(num_entries),
                               CHUNK=chunk, BLOCKS=blocks, USE_PDL=pdl, launch_pdl=pdl, num_warps=4)
    return ExpertBlocks(sorted_ids, expert_ids, num_padded, block_m)
