# Baseline ("old") of benchmarks/sampling.py: infer_core/layers/sampling/fused.py at commit 0ebf34c,
# before the two-pass kernel.
"""The fused GPU sampling pass: temperature, top-k/top-p cut, min-p, Philox noise and argmax.

Each program reads one slice of one row once and keeps the best ``z - log(q)`` (Gumbel-max form
of the exponential race ``argmax(p / q)``, so no softmax is needed): ``z = logits / temperature``,
``q ~ Exp(1)`` from Philox keyed by (row key, position, token). Tokens outside the row's top-k /
top-p set (a threshold value plus how many tokens tied at it are kept, lowest ids first) or below
min-p score -inf. Greedy rows score their raw logits. Logits may be bfloat16, float16 or float32:
each loaded value is widened to float32 in registers (exactly: every bf16/fp16 value is a float32
value), so the tokens are those of the same logits converted first, without the [R, V] float32 copy.
Importing this module imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.sampling.philox import SMALL_V
from infer_core.sampling_params import MIN_SAMPLING_TEMPERATURE

BLOCK = 2048  # tokens per loop iteration of a program
NUM_WARPS = 8
LOGITS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # widened to float32 exactly, in registers
_TARGET_PROGRAMS = 528  # enough programs to fill an H100/H200 (132 SMs) a few times over


@triton.jit
def _count_ties_kernel(logits_ptr, stride, temperature_ptr, threshold_ptr, counts_ptr, vocab_size, num_splits,
                       MIN_TEMPERATURE: tl.constexpr, SLICE: tl.constexpr, BLOCK: tl.constexpr):
    """counts[row, split] = tokens of the slice whose scaled logit equals the row's threshold."""
    row, split = tl.program_id(0), tl.program_id(1)
    temperature = tl.load(temperature_ptr + row)
    temperature = tl.where(temperature < MIN_TEMPERATURE, 1.0, temperature)
    threshold = tl.load(threshold_ptr + row)
    start = split * SLICE  # slices are whole blocks: only the vocabulary's end needs a mask
    count = tl.zeros((), dtype=tl.int32)
    for block in range(SLICE // BLOCK):  # constant bounds (older interpreters reject a tensor bound)
        block_start = start + block * BLOCK
        offs = block_start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        logits = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=in_vocab,
                         other=float("-inf")).to(tl.float32)
        z = tl.math.div_rn(logits, tl.full((BLOCK,), 1.0, tl.float32) * temperature)
        count += tl.sum(((z == threshold) & in_vocab).to(tl.int32), axis=0)
    tl.store(counts_ptr + row * num_splits + split, count)


@triton.jit
def _sample_kernel(logits_ptr, stride, temperature_ptr, min_p_ptr, row_max_ptr, threshold_ptr, num_ties_ptr,
                   ties_before_ptr, key_ptr, position_ptr, best_score_ptr, best_token_ptr, vocab_size, num_splits,
                   HAS_MIN_P: tl.constexpr, HAS_THRESHOLD: tl.constexpr, MIN_TEMPERATURE: tl.constexpr,
                   SMALL_V: tl.constexpr, SLICE: tl.constexpr, BLOCK: tl.constexpr):
    row, split = tl.program_id(0), tl.program_id(1)
    temperature = tl.load(temperature_ptr + row)
    is_greedy = temperature < MIN_TEMPERATURE
    temperature = tl.where(is_greedy, 1.0, temperature)
    key = tl.load(key_ptr + row)
    counter_hi = tl.load(position_ptr + row).to(tl.int64) << 32
    if HAS_MIN_P:  # keep z >= z_max + log(min_p), i.e. p >= min_p * p_max
        z_max = tl.math.div_rn(tl.load(row_max_ptr + row), temperature)
        floor = z_max + tl.log(tl.load(min_p_ptr + row))
    if HAS_THRESHOLD:
        threshold = tl.load(threshold_ptr + row)
        num_ties = tl.load(num_ties_ptr + row)
        ties_seen = tl.load(ties_before_ptr + row * num_splits + split)
    start = split * SLICE  # slices are whole blocks: only the vocabulary's end needs a mask
    best = tl.full((), float("-inf"), tl.float32)
    best_token = tl.zeros((), dtype=tl.int64)
    for block in range(SLICE // BLOCK):  # constant bounds (older interpreters reject a tensor bound)
        block_start = start + block * BLOCK
        offs = block_start + tl.arange(0, BLOCK)
        in_slice = offs < vocab_size
        logits = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=in_slice,
                         other=float("-inf")).to(tl.float32)
        z = tl.math.div_rn(logits, tl.full((BLOCK,), 1.0, tl.float32) * temperature)
        keep = in_slice
        if HAS_THRESHOLD:
            is_tie = (z == threshold) & in_slice
            tie_rank = ties_seen + tl.cumsum(is_tie.to(tl.int32), axis=0)
            keep = keep & ((z > threshold) | (is_tie & (tie_rank <= num_ties)))
            ties_seen += tl.sum(is_tie.to(tl.int32), axis=0)
        if HAS_MIN_P:
            keep = keep & (z >= floor)
        # token v takes output v % 4 of Philox counter (v // 4, position)
        counters = block_start // 4 + tl.arange(0, BLOCK // 4)
        r0, r1, r2, r3 = tl.randint4x(key, counter_hi + counters)
        bits = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BLOCK,))
        v = (bits.to(tl.float32) + 0.5) * 2.3283064365386963e-10  # (bits + 1/2) / 2**32, in (0, 1)
        series = v * (1.0 + v * (0.5 + v * (0.3333333432674408 + v * 0.25)))
        exponential = tl.where(v < SMALL_V, series, -tl.log(1.0 - v))
        score = tl.where(is_greedy, logits, z - tl.log(exponential))
        score = tl.where(keep, score, float("-inf"))
        block_best, block_index = tl.max(score, axis=0, return_indices=True)
        better = block_best > best
        best_token = tl.where(better, block_start + block_index.to(tl.int64), best_token)
        best = tl.where(better, block_best, best)
    tl.store(best_score_ptr + row * num_splits + split, best)
    tl.store(best_token_ptr + row * num_splits + split, best_token)


def num_splits_for(num_rows: int, vocab_size: int) -> int:
    """Slices per row: one for large batches, more when a few rows would leave the GPU idle."""
    wanted = -(-_TARGET_PROGRAMS // max(num_rows, 1))
    return max(1, min(wanted, -(-vocab_size // (4 * BLOCK))))


def fused_sample(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                 min_p: torch.Tensor | None = None, threshold: torch.Tensor | None = None,
                 num_ties: torch.Tensor | None = None) -> torch.Tensor:
    """Sampled token ids [R] int64 of ``logits`` [R, V] (bfloat16, float16 or float32; unit stride along V).

    ``threshold`` [R] float32 / ``num_ties`` [R] int32 describe each row's top-k/top-p set in
    scaled-logit space (see ``thresholds.py``); ``min_p`` [R] float32 (0 = off).
    """
    num_rows, vocab_size = logits.shape
    assert logits.dtype in LOGITS_DTYPES and logits.stride(1) == 1, (logits.dtype, logits.stride())
    num_splits = num_splits_for(num_rows, vocab_size)
    slice_size = triton.cdiv(triton.cdiv(vocab_size, num_splits), BLOCK) * BLOCK
    num_splits = triton.cdiv(vocab_size, slice_size)
    device = logits.device
    best_score = torch.empty(num_rows, num_splits, dtype=torch.float32, device=device)
    best_token = torch.empty(num_rows, num_splits, dtype=torch.int64, device=device)
    grid = (num_rows, num_splits)
    has_threshold = threshold is not None
    ties_before = None
    if has_threshold and num_splits > 1:
        counts = torch.empty(num_rows, num_splits, dtype=torch.int32, device=device)
        _count_ties_kernel[grid](logits, logits.stride(0), temperature, threshold, counts, vocab_size, num_splits,
                                 MIN_TEMPERATURE=MIN_SAMPLING_TEMPERATURE, SLICE=slice_size, BLOCK=BLOCK)
        ties_before = (counts.cumsum(dim=1, dtype=torch.int32) - counts).contiguous()
    elif has_threshold:
        ties_before = torch.zeros(num_rows, 1, dtype=torch.int32, device=device)
    row_max = logits.amax(dim=1).float() if min_p is not None else None  # exact: the max is one of the values
    _sample_kernel[grid](
        logits, logits.stride(0), temperature, min_p, row_max, threshold, num_ties, ties_before, keys, positions,
        best_score, best_token, vocab_size, num_splits,
        HAS_MIN_P=min_p is not None, HAS_THRESHOLD=has_threshold, MIN_TEMPERATURE=MIN_SAMPLING_TEMPERATURE,
        SMALL_V=SMALL_V, SLICE=slice_size, BLOCK=BLOCK, num_warps=NUM_WARPS,
    )
    if num_splits == 1:
        return best_token.view(num_rows)
    return best_token.gather(1, best_score.argmax(dim=1, keepdim=True)).view(num_rows)
