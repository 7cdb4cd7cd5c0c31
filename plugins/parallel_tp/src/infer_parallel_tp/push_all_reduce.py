"""One launch that pushes a tensor to every rank and adds (or, for an all-gather, copies) every rank's.

An all-reduce with one trip over NVLink (the stores, ``pushed_sums.push_tile``) and no flags, where the
one-shot kernel signals, loads from the peers and signals again: mode ``all_reduce`` of the row-parallel
layers (any linear method's stored output), the vocabulary-parallel embedding's lookup in every mode
(``lookup_all_reduce``), and the LM head's all-gather (``all_gather_pushed``). The protocol (words carrying
the round of their push, the abort flag) is ``pushed_sums.py``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter

from infer_parallel_tp.push_target import PushTarget, checked_values_per_word
from infer_parallel_tp.pushed_sums import push_tile, waited_values

@triton.jit(do_not_specialize=["num_rows"])
def _all_reduce_kernel(x_ptr, out_ptr, slots_ptr, dest_ptrs, abort_ptr, num_rows, N, stride_xm, slot_words,
                       ids_ptr, vocab_start, vocab_end, RANK: tl.constexpr, RANKS: tl.constexpr,
                       VALUES_PER_WORD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       USE_PDL: tl.constexpr, LOOKUP: tl.constexpr, GATHER: tl.constexpr):
    """``out = sum over ranks of x``: this program's columns of x pushed to every rank, then every rank's added;
    with ``GATHER``, ``out [rows, RANKS * N]`` is every rank's x side by side instead (the all-gather).

    With ``LOOKUP``, x is an embedding table's rows ``[vocab_start, vocab_end)``, and row m of what is summed
    is token ``ids[m]``'s row there, or zeros where this rank does not hold it (the vocabulary-parallel lookup).
    The round comes from the program's own first word (``push_tile``), so no program waits on another's
    store here; this rank's values are added from registers, not read back from its slot.
    """
    pdl_enter(USE_PDL)
    offs_m = tl.arange(0, BLOCK_M)
    first_col = tl.program_id(0) * BLOCK_N
    cols = first_col + tl.arange(0, BLOCK_N)
    mask = (offs_m < num_rows)[:, None] & (cols < N)[None, :]
    dtype = out_ptr.dtype.element_ty
    x_rows = offs_m.to(tl.int64)
    if LOOKUP:
        ids = tl.load(ids_ptr + offs_m, mask=offs_m < num_rows, other=-1)
        held = (ids >= vocab_start) & (ids < vocab_end)
        x_rows = tl.where(held, ids - vocab_start, 0).to(tl.int64)
        mask_x = mask & held[:, None]
    else:
        mask_x = mask
    x = tl.load(x_ptr + x_rows[:, None] * stride_xm + cols[None, :], mask=mask_x, other=0.0).to(tl.float32)
    round_ = push_tile(x, offs_m, first_col, num_rows, N, dest_ptrs, slots_ptr + RANK * slot_words, dtype,
                       VALUES_PER_WORD, BLOCK_M, BLOCK_N, RANKS)
    offs = offs_m[:, None] * N + cols[None, :]  # of the values in a slot's [rows, N]
    for r in tl.static_range(RANKS):
        if r == RANK:
            part = x
        else:
            part = waited_values(slots_ptr + r * slot_words, offs, mask, round_, abort_ptr, dtype, VALUES_PER_WORD)
        if GATHER:  # rank r's values are columns [r * N, (r + 1) * N) of out
            tl.store(out_ptr + offs_m[:, None] * (RANKS * N) + r * N + cols[None, :], part.to(dtype), mask=mask)
        elif r == 0:
            acc = part
        else:
            acc += part
    if not GATHER:
        tl.store(out_ptr + offs_m[:, None] * N + cols[None, :], acc.to(dtype), mask=mask)


ALL_REDUCE_TILE = 1024  # values a program of _all_reduce_kernel pushes and adds: 4 programs for one 4096-wide row


def all_reduce_pushed(x: torch.Tensor, target: PushTarget) -> torch.Tensor:
    """The sum over the ranks of every rank's ``x`` ``[..., n]``, in a new tensor: one launch that pushes this
    rank's values into its slot of ``target`` on every rank and adds every rank's once they carry the round.

    An all-reduce with one trip over NVLink (the stores) and no flags, where the one-shot kernel signals,
    loads from the peers and signals again. Any ``x`` the target fits (``max_rows`` rows of ``n``), so any
    linear method's output; sums in float32, rank order, rounded once (two ranks: the correctly rounded a + b).
    """
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return _push_and_add(rows, rows.shape[0], target, None, 0, 0).view(x.shape)


def all_gather_pushed(x: torch.Tensor, target: PushTarget) -> torch.Tensor:
    """Every rank's ``x`` ``[rows, n]`` side by side in rank order, ``[rows, world * n]``, in one launch that pushes
    this rank's values into its slot of ``target`` on every rank and copies every rank's once they carry the round.

    For the LM head's logits, in place of NCCL's all-gather and its event nodes in each decode graph. The values
    are copied, not rounded: the bits of every rank's x.
    """
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"all_gather_pushed takes [rows, n] rows with contiguous values, not {tuple(x.shape)}")
    return _push_and_add(x, x.shape[0], target, None, 0, 0, gather=True)


def lookup_all_reduce(ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, vocab_end: int,
                      target: PushTarget) -> torch.Tensor:
    """The vocabulary-parallel embedding of ``ids`` (1-D) in one launch, ``[len(ids), hidden]``: each rank
    looks up the tokens of its rows ``[vocab_start, vocab_end)`` of the table (``weight``: those rows), zeros for
    the others, and pushes and adds as :func:`all_reduce_pushed`: every row comes from the rank that holds it,
    bit for bit. In place of a masked lookup's several small launches and an all-reduce launch."""
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"token ids must be a 1-D integer tensor, not {tuple(ids.shape)} {ids.dtype}")
    if weight.stride(-1) != 1:
        raise ValueError("the embedding table's rows must be contiguous")
    return _push_and_add(weight, ids.shape[0], target, ids.contiguous(), vocab_start, vocab_end)


def _push_and_add(x_rows: torch.Tensor, num_rows: int, target: PushTarget, ids: torch.Tensor | None,
                  vocab_start: int, vocab_end: int, gather: bool = False) -> torch.Tensor:
    """``_all_reduce_kernel`` over ``num_rows`` rows of ``x_rows`` (``ids``: rows looked up by token)."""
    n = x_rows.shape[-1]
    if x_rows.dtype != target.dtype or n != target.n or not 0 < num_rows <= target.max_rows:
        raise ValueError(f"push target of {target.max_rows} rows of {target.n} {target.dtype} cannot "
                         f"{'all-gather' if gather else 'all-reduce'} {num_rows} rows of {n} {x_rows.dtype}")
    per_word = checked_values_per_word(target)
    out = torch.empty((num_rows, target.world_size * n if gather else n), dtype=x_rows.dtype, device=x_rows.device)
    block_m = triton.next_power_of_2(num_rows)
    block_n = max(per_word, min(triton.next_power_of_2(n), ALL_REDUCE_TILE // block_m))
    pdl = use_pdl(out)
    _all_reduce_kernel[(triton.cdiv(n, block_n),)](
        x_rows, out, target.slots, target.dest_ptrs, target.abort, num_rows, n, x_rows.stride(0),
        target.slots[0].numel(), ids if ids is not None else out, vocab_start, vocab_end,
        RANK=target.rank, RANKS=target.world_size, VALUES_PER_WORD=per_word, BLOCK_M=block_m, BLOCK_N=block_n,
        USE_PDL=pdl, launch_pdl=pdl, LOOKUP=ids is not None, GATHER=gather,
    )
    return out
