"""Tensor-parallel partial sums pushed to every rank by the kernel that makes them, added by the kernel that reads them.

A batch-1 decode step of a row-parallel model all-reduces one hidden vector twice a layer; as a launch of its
own that is the kernel boundary, then a flag round trip over NVLink before and after the peer loads. Here the
row-parallel GEMV's programs (``pushing_gemv.py``) store their tile of partial sums straight into their rank's
slot of the site on every rank (``PushTarget``: peer addresses), and the reading kernel adds the slots from
its own memory once every rank's values are there.

The signal travels with the data (the low-latency protocol of NCCL's "LL"): a slot is 64-bit words,
each 32 bits of values (one float32, or two bfloat16 / float16 side by side) and the 32-bit round of
the push that wrote them. A word is stored in one piece, so a reader that sees this round in a word
sees its values: no fence, no counter, no flag, nothing but the stores on the writer's side (a flag raised
after a count of the writer's programs measured slower: ``tp-pushed-gpu-scope-*`` in benchmarks/results).

Rounds, per site, counted the same on every rank (every rank pushes into every site in the same
order): the writer's program takes the round of the first word it is about to overwrite in its own
rank's slot here (its own word: no other program writes it) and writes that + 1; a reader takes the
round from word 0 of its own rank's slot (its rank's GEMV ran before it on the stream) and waits until
the other ranks' words it reads carry the same. Words of rows a push left out keep an older round,
so are never mistaken for this one; rounds wrap at 2**32, compared for equality. A slot is rewritten
one round later only after its readers have finished: a rank pushes site s again only after the reads
of site s - 1 of the next round, which wait for every rank, each of which read site s before that
(two sites or more a step). A raised ``abort`` (a peer died) lets every wait through.

Sums are in float32 in rank order 0, 1, ... and rounded once to the dtype, on every rank the same
bits; with two ranks the correctly rounded a + b, NCCL's sum.

Who adds the slots is the target's ``mode`` (``pushed_partial_sums_mode``): ``gemv`` (the pushing GEMV's own
last programs, ``add_pushed_block``: no launch of its own; they wait for this rank's other programs too),
``sum`` (``sum_pushed``, a few programs right after the pushing GEMV), or ``all_reduce`` (``all_reduce_pushed``:
the GEMV stores as usual, and one small kernel pushes and adds). In mode ``gemv`` the adding programs take the
round from their own push; they wait only on programs that never wait (this rank's and the peers' column
blocks), and are too few (a program per ``ADD_BLOCK`` values) to keep those off a GPU, so no launch can
deadlock. Triton's interpreter runs a launch's programs one after another, so there the last program adds
every value (``adding_block``). ``push_all_reduce.py`` has the kernel of mode ``all_reduce``, which also looks
up the vocabulary-parallel embedding and all-gathers the LM head's logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter

from infer_parallel_tp.push_target import PushTarget, checked_values_per_word, values_per_word

SUM_BLOCK = 1024  # elements a program of _sum_kernel adds
# values an adding program of the pushing GEMV adds (mode gemv): more, narrower programs start adding sooner
# (benchmarks/results: tp2-add-block-experiment-*)
ADD_BLOCK = 256


@triton.jit
def _round_of(words):
    return (words >> 32) & 0xFFFFFFFF


@triton.jit
def push_tile(acc, offs_m, first_col, num_rows, N, dest_ptrs, own_slot_ptr, VALUE_DTYPE: tl.constexpr,
              VALUES_PER_WORD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RANKS: tl.constexpr):
    """Store ``acc [BLOCK_M, BLOCK_N]`` (rows ``offs_m``, columns ``first_col + arange(BLOCK_N)``), rounded to
    ``VALUE_DTYPE``, as this round's words of this rank's ``[max_rows, N / VALUES_PER_WORD]`` slot on every rank.

    ``own_slot_ptr``: that slot here, where the round is read; ``dest_ptrs``: its address on each rank.
    ``VALUES_PER_WORD`` (``values_per_word``) comes from the launcher: Triton 3.6 compiled both sides of a
    branch on a width computed in the kernel. Returns the round written.
    """
    words_n = N // VALUES_PER_WORD
    first_word = first_col // VALUES_PER_WORD
    # the round of this program's first word (row 0): no other program of the launch writes it
    round_ = (_round_of(tl.load(own_slot_ptr + first_word, cache_modifier=".cg")) + 1) & 0xFFFFFFFF
    values = acc.to(VALUE_DTYPE)
    if VALUES_PER_WORD == 1:
        bits = values.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    else:  # columns 2j and 2j + 1 share a word, 2j in the low half
        halves = values.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        low, high = tl.split(tl.reshape(halves, [BLOCK_M, BLOCK_N // VALUES_PER_WORD, 2]))
        bits = (low | (high << 16)).to(tl.int64) & 0xFFFFFFFF
    words = bits | (round_ << 32)
    word_cols = first_word + tl.arange(0, BLOCK_N // VALUES_PER_WORD)
    mask = (offs_m[:, None] < num_rows) & (word_cols[None, :] < words_n)
    offs = offs_m[:, None] * words_n + word_cols[None, :]
    for r in tl.static_range(RANKS):
        slot = tl.load(dest_ptrs + r).to(tl.pointer_type(tl.int64))
        tl.store(slot + offs, words, mask=mask)
    return round_


@triton.jit
def _wait_for_round(ptrs, mask, round_, abort_ptr):
    """Spin until every word at ``ptrs`` (where ``mask``) carries ``round_``, or ``abort`` is raised."""
    # the loop carries a count, not the words (a loop carrying them crashed Triton 3.6's layout pass)
    missing = 1
    while (missing > 0) & (tl.load(abort_ptr, volatile=True) == 0):
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        missing = tl.sum((mask & (_round_of(words) != round_)).to(tl.int32))


@triton.jit
def _values(words, offs, VALUE_DTYPE: tl.constexpr, VALUES_PER_WORD: tl.constexpr):
    """The value at element offset ``offs`` in its word, as float32."""
    if VALUES_PER_WORD == 1:
        value = (words & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        half = ((words >> ((offs & 1) * 16)) & 0xFFFF).to(tl.int16)
        value = half.to(VALUE_DTYPE, bitcast=True).to(tl.float32)
    return value


@triton.jit
def waited_values(slot_ptr, offs, mask, round_, abort_ptr, VALUE_DTYPE: tl.constexpr, VALUES_PER_WORD: tl.constexpr):
    """The values at element offsets ``offs`` of one rank's slot (``slot_ptr``), once their words carry ``round_``."""
    ptrs = slot_ptr + offs // VALUES_PER_WORD
    _wait_for_round(ptrs, mask, round_, abort_ptr)
    return _values(tl.load(ptrs, mask=mask, other=0, volatile=True), offs, VALUE_DTYPE, VALUES_PER_WORD)


@triton.jit
def load_summed(slots_ptr, slot_words, offs, mask, abort_ptr, RANK: tl.constexpr, RANKS: tl.constexpr,
                VALUE_DTYPE: tl.constexpr, VALUES_PER_WORD: tl.constexpr):
    """The ranks' partial sums at element offsets ``offs`` of a slot, added in rank order and rounded to
    ``VALUE_DTYPE``, as float32, once every other rank's words there carry this round. ``slots_ptr``: rank 0's
    slot here, rank r's ``r * slot_words`` words on.
    """
    word_offs = offs // VALUES_PER_WORD
    round_ = _round_of(tl.load(slots_ptr + RANK * slot_words, cache_modifier=".cg"))
    for r in tl.static_range(RANKS):
        ptrs = slots_ptr + r * slot_words + word_offs
        if r != RANK:
            _wait_for_round(ptrs, mask, round_, abort_ptr)
            words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        else:  # cached: a kernel starts with L1 clean, and no line of these words is loaded before the wait
            words = tl.load(ptrs, mask=mask, other=0)
        if r == 0:
            acc = _values(words, offs, VALUE_DTYPE, VALUES_PER_WORD)
        else:
            acc += _values(words, offs, VALUE_DTYPE, VALUES_PER_WORD)
    return acc.to(VALUE_DTYPE).to(tl.float32)


@triton.jit
def add_pushed_block(slots_ptr, slot_words, out_ptr, block, num_rows, N, round_, abort_ptr, RANKS: tl.constexpr,
                     VALUE_DTYPE: tl.constexpr, VALUES_PER_WORD: tl.constexpr, BLOCK: tl.constexpr):
    """Elements ``[block * BLOCK, (block + 1) * BLOCK)`` of ``out`` ``[num_rows, N]``: every rank's words
    there, this rank's too, once they carry ``round_``, added in rank order and rounded once (mode ``gemv``: the
    pushing GEMV's last programs call it, so this rank's words come from other programs of the same launch)."""
    offs = block * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_rows * N
    for r in tl.static_range(RANKS):
        part = waited_values(slots_ptr + r * slot_words, offs, mask, round_, abort_ptr, VALUE_DTYPE, VALUES_PER_WORD)
        if r == 0:
            acc = part
        else:
            acc += part
    tl.store(out_ptr + offs, acc.to(VALUE_DTYPE), mask=mask)


def adding_block(num_values: int, on_gpu: bool) -> int:
    """Values each adding program of a pushing GEMV adds (mode ``gemv``), ``num_values`` being the sum's.

    ``ADD_BLOCK`` on a GPU. Triton's interpreter runs a launch's programs one after another, so an adding
    program there could wait for a push of a program after it: one program, the last, adds them all.
    """
    return ADD_BLOCK if on_gpu else triton.next_power_of_2(num_values)


@triton.jit(do_not_specialize=["num_rows"])
def _sum_kernel(slots_ptr, abort_ptr, out_ptr, num_rows, N, slot_words, RANK: tl.constexpr, RANKS: tl.constexpr,
                VALUES_PER_WORD: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """``out[m, :] = sum over ranks of slot r's values [m, :]`` once every rank has pushed them."""
    pdl_enter(USE_PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_rows * N
    dtype = out_ptr.dtype.element_ty
    summed = load_summed(slots_ptr, slot_words, offs, mask, abort_ptr, RANK, RANKS, dtype, VALUES_PER_WORD)
    tl.store(out_ptr + offs, summed.to(dtype), mask=mask)


def sum_pushed(target: PushTarget, num_rows: int) -> torch.Tensor:
    """``[num_rows, N]``: the ranks' partial sums in ``target``, added once every rank has pushed them."""
    max_rows, n = target.max_rows, target.n
    if not 0 < num_rows <= max_rows:
        raise ValueError(f"{num_rows} rows do not fit the push target's {max_rows}")
    out = torch.empty((num_rows, n), dtype=target.dtype, device=target.slots.device)
    pdl = use_pdl(out)
    _sum_kernel[(triton.cdiv(num_rows * n, SUM_BLOCK),)](
        target.slots, target.abort, out, num_rows, n, target.slots[0].numel(),
        RANK=target.rank, RANKS=target.world_size, VALUES_PER_WORD=values_per_word(target.dtype), BLOCK=SUM_BLOCK,
        USE_PDL=pdl, launch_pdl=pdl,
    )
    return out
