"""Tensor-parallel partial sums pushed to every rank by the GEMV that makes them, added by the kernel that reads them.

A batch-1 decode step of a row-parallel model all-reduces one hidden vector twice a layer. As its
own launch that costs some 8 us on two H200s (the kernel boundary, then a flag round trip over
NVLink before and after the peer loads), 72 times a Qwen3-8B step. Here the row-parallel GEMV's
programs store their tile of partial sums straight into their rank's slot of the site on every rank
(``PushTarget``: peer addresses), and the reading kernel (``norm_gemv.py``, or ``_sum_kernel`` here)
adds the slots from its own memory once every rank's values are there. The wait sits after that
kernel's weight loads, so the weights stream in while the values cross.

The signal travels with the data (the low-latency protocol of NCCL's "LL"): a slot is 64-bit words,
each 32 bits of values (one float32, or two bfloat16 / float16 side by side) and the 32-bit round of
the push that wrote them. A word is stored in one piece, so a reader that sees this round in a word
sees its values: no fence, no counter, no flag, nothing but the stores on the writer's side. A first
version signalled with a flag per rank raised by the GEMV's last program after a GPU-scoped count of
its programs; on two H200s a Qwen3-8B decode step took 3.765 ms with it against 3.496 with the one-shot
all-reduce kernel, which is why the writer now does nothing but store.

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
``sum`` (``sum_pushed``, a few programs right after the pushing GEMV), ``fused`` (the next norm + GEMV's
prologue, ``load_summed``), or ``all_reduce`` (``all_reduce_pushed``: the GEMV stores as usual, and one small
kernel pushes and adds). In mode ``gemv`` the adding programs take the round from their own push; they wait
only on programs that never wait (this rank's and the peers' column blocks), and are too few (a program
per ``ADD_BLOCK`` values) to keep those off a GPU, so no launch can deadlock. Triton's interpreter runs a
launch's programs one after another, so there the last program adds every value (``adding_block``).
The all-reduce kernel also all-gathers (``all_gather_pushed``, the LM head's logits over a site of their own):
each rank's values are copied side by side instead of added.
Measured on two H200s, Qwen3-8B batch-1 decode (``python -m benchmarks.tp``, tree 19d16b0, TP=1 4.83 ms):
sum 3.141 ms a step, all_reduce 3.265, the one-shot all-reduce kernel 3.503; fused 3.684-3.695 on earlier
trees (its ~260 programs each wait on the words; letting it in late, or loading the words L2-only, was slower).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.interfaces import PushTarget
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter
from infer_core.layers.partial_sums import checked_values_per_word, values_per_word

SUM_BLOCK = 1024  # elements a program of _sum_kernel adds
# values an adding program of the pushing GEMV adds (mode gemv). On two H200s, Qwen3-8B TP=2 decode at a55b51d:
# 2.735 ms a step at 256 and at 128, 2.756 at 1024 (one run each); more, narrower programs start adding sooner
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
def _waited_values(slot_ptr, offs, mask, round_, abort_ptr, VALUE_DTYPE: tl.constexpr, VALUES_PER_WORD: tl.constexpr):
    """The values at element offsets ``offs`` of one rank's slot (``slot_ptr``), once their words carry ``round_``."""
    ptrs = slot_ptr + offs // VALUES_PER_WORD
    _wait_for_round(ptrs, mask, round_, abort_ptr)
    return _values(tl.load(ptrs, mask=mask, other=0, volatile=True), offs, VALUE_DTYPE, VALUES_PER_WORD)


@triton.jit
def load_summed(slots_ptr, slot_words, offs, mask, abort_ptr, RANK: tl.constexpr, RANKS: tl.constexpr,
                VALUE_DTYPE: tl.constexpr, VALUES_PER_WORD: tl.constexpr, WAIT: tl.constexpr):
    """The ranks' partial sums at element offsets ``offs`` of a slot, added in rank order and rounded to
    ``VALUE_DTYPE``, as float32. ``slots_ptr``: rank 0's slot here, rank r's ``r * slot_words`` words on.

    ``WAIT``: first wait until every other rank's words there carry this round (the first read of the
    site in a kernel); later reads of the same words in the kernel need not.
    """
    word_offs = offs // VALUES_PER_WORD
    if WAIT:
        round_ = _round_of(tl.load(slots_ptr + RANK * slot_words, cache_modifier=".cg"))
    for r in tl.static_range(RANKS):
        ptrs = slots_ptr + r * slot_words + word_offs
        if WAIT and r != RANK:
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
        part = _waited_values(slots_ptr + r * slot_words, offs, mask, round_, abort_ptr, VALUE_DTYPE, VALUES_PER_WORD)
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
    summed = load_summed(slots_ptr, slot_words, offs, mask, abort_ptr, RANK, RANKS, dtype, VALUES_PER_WORD, True)
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
            part = _waited_values(slots_ptr + r * slot_words, offs, mask, round_, abort_ptr, dtype, VALUES_PER_WORD)
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

    For the LM head's logits, in place of NCCL's all-gather (the Qwen3-8B TP=2 rank-0 trace at 36548bd: 8.6 us,
    and NCCL's event nodes in each decode graph). The values are copied, not rounded: the bits of every rank's x.
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
