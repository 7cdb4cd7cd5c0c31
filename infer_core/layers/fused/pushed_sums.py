"""Tensor-parallel partial sums pushed to every rank by the GEMV that makes them, added by the kernel that reads them.

A batch-1 decode step of a row-parallel model all-reduces one hidden vector twice a layer. As its
own launch that costs some 8 us on two H200s (the kernel boundary, then a flag round trip over
NVLink before and after the peer loads), 72 times a Qwen3-8B step. Here the row-parallel GEMV's
programs store their tile of partial sums straight into their rank's slot of the site on every rank
(``PushTarget``: peer addresses), and the reading kernel (``norm_gemv.py``, or ``_sum_kernel`` here)
waits for every rank's flag and adds the slots from its own memory. The wait sits after that
kernel's weight loads, so the weights stream in while the flags cross.

The signal, one round per use of the site:

- each program of the pushing GEMV stores its tile, passes a CTA barrier, and adds 1 to the local
  ``counter`` (acq_rel, GPU scope); the program that takes it to the grid's size resets it and
  writes the round (its rank's previous flag + 1) into its rank's flag on every rank (release,
  system scope). The programs' releases, the last one's acquire and its system-scoped release
  order every program's stores before the flag, for the peers too (causality is transitive).
- a reader takes the round from its own rank's flag (its rank's GEMV ran before it on the stream),
  polls until every rank's flag shows it (or until ``abort`` is raised after a peer died), then
  acquires it once.

Rounds only ever grow (int32, compared for equality, so wrapping is harmless), and nothing is reset
between rounds but the counter, by the kernel that used it. A slot is rewritten one round later only
after its readers have finished: a rank pushes site s again only after the reads of site s - 1 of the
next round, which wait for every rank, each of which read site s before that (two sites or more a step).

Sums are in float32 in rank order 0, 1, ... and rounded once to the dtype, on every rank the same
bits; with two ranks the correctly rounded a + b, NCCL's sum.

Measured (two H200s, Qwen3-8B batch-1 decode, ``python -m benchmarks.tp``): correct, and slower than
the one-shot all-reduce it replaces, 3.765 ms a step against 3.496 (3.894 with system-scoped counts).
Where the difference goes is not measured yet (the profiler gives a reading norm + GEMV 38.9 us a launch,
its wait included, but PDL launches overlap, so launch times do not add up to the step). Hence off by
default (``enable_pushed_partial_sums``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.interfaces import PushTarget
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter


@triton.jit
def push_tile(acc, offs_m, cols, num_rows, N, dest_ptrs, local_slot_ptr, RANKS: tl.constexpr):
    """Store ``acc [BLOCK_M, BLOCK_N]`` at rows ``offs_m``, columns ``cols`` of this rank's ``[max_rows, N]``
    slot on every rank (addresses in ``dest_ptrs``), rounded to the dtype of ``local_slot_ptr`` (any slot here)."""
    dtype = local_slot_ptr.dtype.element_ty
    mask = (offs_m[:, None] < num_rows) & (cols[None, :] < N)
    offs = offs_m[:, None] * N + cols[None, :]
    value = acc.to(dtype)
    for r in tl.static_range(RANKS):
        slot = tl.load(dest_ptrs + r).to(tl.pointer_type(dtype))
        tl.store(slot + offs, value, mask=mask)


@triton.jit
def signal_pushed(counter_ptr, flag_ptrs, RANK: tl.constexpr, RANKS: tl.constexpr):
    """After this program's pushes: count it; the grid's last program raises the round on every rank.

    The count is GPU-scoped (the programs share a device); only the last program's flag writes are
    system-scoped releases, which carry the other programs' stores along (they happen before them).
    A system-scoped count would fence every program at system scope.
    """
    tl.debug_barrier()  # every thread's stores precede the one thread's release below
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") + 1
    if arrived == tl.num_programs(0):
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        own_flag = tl.load(flag_ptrs + RANK).to(tl.pointer_type(tl.int32))
        round_ = tl.atomic_add(own_flag, 0, sem="relaxed", scope="gpu") + 1
        for r in tl.static_range(RANKS):
            flag = tl.load(flag_ptrs + r).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(flag, round_, sem="release", scope="sys")


@triton.jit
def wait_pushed(flags_ptr, abort_ptr, RANK: tl.constexpr, RANKS: tl.constexpr):
    """Until every rank has pushed this round into the site (``flags_ptr``: the site's local flags).

    Polls with relaxed loads and acquires once the round is seen: an acquire on every poll would
    fence at system scope on every poll, in every program of the reader.
    """
    round_ = tl.atomic_add(flags_ptr + RANK, 0, sem="relaxed", scope="gpu")
    for r in tl.static_range(RANKS):
        if r != RANK:
            seen = tl.atomic_add(flags_ptr + r, 0, sem="relaxed", scope="sys")
            while (seen != round_) & (tl.atomic_add(abort_ptr, 0, sem="relaxed", scope="sys") == 0):
                seen = tl.atomic_add(flags_ptr + r, 0, sem="relaxed", scope="sys")
            tl.atomic_add(flags_ptr + r, 0, sem="acquire", scope="sys")  # the pushes before the flag are visible
    tl.debug_barrier()  # the one thread's acquire precedes every thread's loads of the slots


@triton.jit
def load_summed(partials_ptr, slot_stride, offs, mask, RANKS: tl.constexpr):
    """The ranks' partial sums at ``offs`` added in rank order, rounded to their dtype, as float32."""
    acc = tl.load(partials_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for r in tl.static_range(1, RANKS):
        acc += tl.load(partials_ptr + r * slot_stride + offs, mask=mask, other=0.0).to(tl.float32)
    return acc.to(partials_ptr.dtype.element_ty).to(tl.float32)


@triton.jit(do_not_specialize=["num_rows"])
def _sum_kernel(partials_ptr, flags_ptr, abort_ptr, out_ptr, num_rows, N, slot_stride,
                RANK: tl.constexpr, RANKS: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """``out[m, :] = sum over ranks of partials[r, m, :]`` once every rank has pushed."""
    pdl_enter(USE_PDL)
    wait_pushed(flags_ptr, abort_ptr, RANK, RANKS)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_rows * N
    summed = load_summed(partials_ptr, slot_stride, offs, mask, RANKS)
    tl.store(out_ptr + offs, summed.to(out_ptr.dtype.element_ty), mask=mask)


SUM_BLOCK = 1024  # elements a program of _sum_kernel adds


def sum_pushed(target: PushTarget, num_rows: int) -> torch.Tensor:
    """``[num_rows, N]``: the ranks' partial sums in ``target``, added once every rank has pushed them."""
    world, max_rows, n = target.partials.shape
    if not 0 < num_rows <= max_rows:
        raise ValueError(f"{num_rows} rows do not fit the push target's {max_rows}")
    out = torch.empty((num_rows, n), dtype=target.partials.dtype, device=target.partials.device)
    pdl = use_pdl(out)
    _sum_kernel[(triton.cdiv(num_rows * n, SUM_BLOCK),)](
        target.partials, target.flags, target.abort, out, num_rows, n, max_rows * n,
        RANK=target.rank, RANKS=world, BLOCK=SUM_BLOCK, USE_PDL=pdl, launch_pdl=pdl,
    )
    return out
