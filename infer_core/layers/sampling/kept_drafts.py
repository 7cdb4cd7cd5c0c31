"""A step planned over a greedy verify step still running, made exact on the device in one launch.

The scheduler planned step N+1 as if step N kept every draft (runner/accepted_drafts.py states the
invariant). For each request of step N+1 that step N sampled, one program reads step N's rows of that
request (draft ids and sampled ids), finds the first position whose draft differs from the sampled
token (the position after the last draft verifies none, so there is one), writes that position's
token as the request's first input of step N+1, and moves the request's positions back by the rows
after it: its positions, KV slots and sequence length. In torch that is about thirty small launches;
at batch 1 each costs the host as much as the GPU's whole share of it. Importing this module imports
triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# Every pointer (the first 13 arguments) unspecialised on its alignment: several sit at offsets of packed buffers
# that move with the batch (a request count's parity), and a variant per alignment would compile mid-run after
# ``warm_up``.
@triton.jit(do_not_specialize_on_alignment=list(range(13)))
def _kept_drafts_kernel(sampled_ptr, draft_ptr, seg_start_ptr, seg_end_ptr,
                        pending_src_ptr, pending_rows_ptr, pending_dst_ptr,
                        input_ids_ptr, positions_ptr, slot_mapping_ptr, seq_lens_ptr, query_start_ptr,
                        block_tables_ptr, block_table_stride, block_size,
                        BLOCK_ROWS: tl.constexpr, BLOCK_QUERY: tl.constexpr):
    p = tl.program_id(0)
    src = tl.load(pending_src_ptr + p)
    lo = tl.load(seg_start_ptr + src)
    hi = tl.load(seg_end_ptr + src)
    rows = lo + tl.arange(0, BLOCK_ROWS)
    in_seg = rows < hi
    drafts = tl.load(draft_ptr + rows, mask=in_seg, other=-1)
    tokens = tl.load(sampled_ptr + rows, mask=in_seg, other=-1)
    missed = in_seg & (drafts != tokens.to(drafts.dtype))
    first_missed = tl.min(tl.where(missed, rows, hi), axis=0)
    kept = tl.load(sampled_ptr + first_missed)
    tl.store(input_ids_ptr + tl.load(pending_dst_ptr + p), kept.to(input_ids_ptr.dtype.element_ty))
    rejected = (hi - 1 - first_missed).to(tl.int32)
    row = tl.load(pending_rows_ptr + p)
    tl.store(seq_lens_ptr + row, tl.load(seq_lens_ptr + row) - rejected)
    q0 = tl.load(query_start_ptr + row)
    q1 = tl.load(query_start_ptr + row + 1)
    query = q0 + tl.arange(0, BLOCK_QUERY)
    in_query = query < q1
    positions = tl.load(positions_ptr + query, mask=in_query, other=0) - rejected
    tl.store(positions_ptr + query, positions, mask=in_query)
    blocks = tl.load(block_tables_ptr + row.to(tl.int64) * block_table_stride + positions // block_size,
                     mask=in_query, other=0)
    tl.store(slot_mapping_ptr + query, blocks * block_size + positions % block_size, mask=in_query)


# A program's blocks cover a pending request's rows in the verify step and its query in the next, each at most 1 +
# its drafts: at least 16 wide, so one compiled variant serves up to 15 drafts (compiled at start: ``warm_up``),
# whatever else the step holds (a long prompt chunk beside a pending request is not a pending query).
MIN_BLOCK = 16


def _block(n: int) -> int:
    return max(MIN_BLOCK, triton.next_power_of_2(n))


def keep_drafts(sampled: torch.Tensor, draft_ids: torch.Tensor, seg_start: torch.Tensor, seg_end: torch.Tensor,
                pending_src: torch.Tensor, pending_rows: torch.Tensor, pending_dst: torch.Tensor,
                input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                query_start_loc: torch.Tensor, block_tables: torch.Tensor, block_size: int,
                max_rows: int, max_pending_query_len: int) -> None:
    """For every pending request p (``pending_src[p]``: its index among step N's sampled requests, whose rows are
    ``seg_start..seg_end``; ``pending_rows[p]``: its batch row in step N+1; ``pending_dst[p]``: its first input's
    flat index): place its last kept token and move its positions back by the rows step N rejected, in place.
    ``max_rows``: the most rows a request has in step N; ``max_pending_query_len``: the longest query of a
    pending request in step N+1."""
    num_pending = pending_src.shape[0]
    if num_pending:
        _kept_drafts_kernel[(num_pending,)](
            sampled, draft_ids, seg_start, seg_end, pending_src, pending_rows, pending_dst,
            input_ids, positions, slot_mapping, seq_lens, query_start_loc, block_tables, block_tables.stride(0),
            block_size, BLOCK_ROWS=_block(max_rows), BLOCK_QUERY=_block(max_pending_query_len), num_warps=1)


def warm_up(device: torch.device, block_table_stride: int, block_size: int) -> None:
    """Compile the kernel now (for block tables of this row stride), with the argument types the runner passes
    (``AcceptedDrafts.apply``: int64 sampled ids, draft ids and segments, the step's int32 buffers): one pending
    request that kept its one draft."""
    ints, longs = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
    sampled, drafts = torch.tensor([5, 6], **longs), torch.tensor([5, -1], **longs)
    first, end, zero = torch.tensor([0], **longs), torch.tensor([2], **longs), torch.zeros(1, **ints)
    positions, slots, seq_lens = torch.tensor([3, 4], **ints), torch.zeros(2, **ints), torch.tensor([5], **ints)
    keep_drafts(sampled, drafts, first, end, zero, zero, zero, torch.zeros(2, **ints), positions, slots, seq_lens,
                torch.tensor([0, 2], **ints), torch.zeros(1, block_table_stride, **ints), block_size, 2, 2)
