"""The fused sampling kernels: one launch samples (or takes the argmax of) every row.

Program (row, split) owns one slice of one row, a whole number of tiles of TILE tokens.

Why: scoring every token exactly (an IEEE division, two exact logarithms and Philox) took ~110
instructions per token, so at 256 x 151936 the old one-pass kernel was bound by instruction issue
(~5x the time to read the logits), not by memory. Sampled rows now take two passes over their
slice. Pass A computes, for every token, a cheap upper bound of its score ``z - log(q)``: the
logit times ``log2(e) / t`` minus ``log2`` of a lower bound of the Exp(1) draw from its top 23
bits (one FMA and one fast log2 besides Philox: ~19 instructions per token, no barrier), and keeps
per counter position of the tile the largest bound over the slice's tiles. Pass B scores exactly
(the old kernel's arithmetic, so the same tokens) only the groups (one counter position across
the slice's tiles) whose bound can still beat the best score found, highest bound first: one
group in almost every row. Exact means: a skipped group's every score is provably <= the best
(see ``bound_margin``), and the winner is the old kernel's (highest score, lowest token on ties).

Greedy rows (a greedy batch, or rows at temperature 0 among sampled ones) take one pass of int64
keys: the argmax with torch's rules (first maximum; a NaN is the maximum). Their top-k/top-p cut
and min-p floor always keep the first maximum, so they need neither. The programs of a split row
combine in the same launch: each stores its best key, and the last of the row's programs to finish
(an atomic counter, which it resets for the next launch) writes the token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from infer_core.layers.sampling.kernel_parts import (
    FLT_MAX,
    KEY_NONE,
    LN2,
    LOG2E,
    bound_margin,
    group_key,
    key_score,
    key_token,
    noise_bits,
    noise_bound,
    nth_tie,
    order_to_float,
    score_key,
    smallest_reaching,
    tie_interval,
    tile_offsets,
)


@triton.jit
def _bounds(row_ptr, start, vocab_size, temperature, key, position, lo, hi, floor_lo,
            HAS_THRESHOLD: tl.constexpr, HAS_MIN_P: tl.constexpr, NUM_TILES: tl.constexpr, TILE: tl.constexpr,
            NATIVE: tl.constexpr):
    """Pass A: per counter position the largest bound over the slice's tiles, and the slice's tie count.

    Bounds are in log2 units inside the loop (``logits * (log2(e) / t) - log2(u)``: one FMA per
    token) and converted to natural ones per position at the end.
    """
    NC: tl.constexpr = TILE // 4
    inv_temperature_log2 = tl.math.div_rn(1.0, temperature) * LOG2E
    # A token whose logit is -inf (masked by a grammar, past the vocabulary) scores -inf: its bound is -inf, so
    # pass B never visits a group of such tokens (a grammar-masked row leaves whole slices so). Any other
    # token's bound is at least -FLT_MAX: a logit whose z is finite but whose product with log2(e) / t
    # overflows has a bound of -inf, and its score (>= -FLT_MAX * ln 2 there) is then still covered.
    acc = tl.full((NC, 4), float("-inf"), tl.float32)
    floor = tl.full((NC, 4), -FLT_MAX, tl.float32)
    ties = tl.zeros((NC, 4), tl.int32)
    offs = tile_offsets(start, NC)
    upcoming = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf"))
    for t in range(NUM_TILES):  # constant bounds (older interpreters reject a tensor bound)
        offs = tile_offsets(start + t * TILE, NC)
        logits = upcoming.to(tl.float32)
        ahead = offs + TILE  # the next tile's load is in flight while this one is computed
        upcoming = tl.load(row_ptr + ahead, mask=(ahead < vocab_size) & (t + 1 < NUM_TILES), other=float("-inf"))
        counters = (start + t * TILE) // 4 + tl.arange(0, NC)
        bound = logits * inv_temperature_log2 + noise_bound(noise_bits(key, position, counters, NATIVE), NATIVE)
        bound = tl.where(logits == float("-inf"), float("-inf"), tl.maximum(floor, bound))  # NaN: the floor
        if HAS_THRESHOLD:  # tokens below the cut score -inf (ties may be cut too: bounding them is safe)
            bound = tl.where(logits >= lo, bound, float("-inf"))
            ties += ((logits >= lo) & (logits <= hi) & (offs < vocab_size)).to(tl.int32)
        if HAS_MIN_P:
            bound = tl.where(logits >= floor_lo, bound, float("-inf"))
        acc = tl.maximum(acc, bound)  # NaN bounds (NaN logits, or -inf + inf) are skipped: those score -inf
    return tl.max(acc, axis=1) * LN2, tl.sum(tl.sum(ties, axis=1), axis=0)


@triton.jit
def _argmax_keys(row_ptr, start, vocab_size, NUM_TILES: tl.constexpr, TILE: tl.constexpr):
    """One pass: the best greedy key of the slice (first maximum; the first NaN if there is one)."""
    NC: tl.constexpr = TILE // 4
    best = tl.full((NC, 4), float("-inf"), tl.float32)  # per position: the first largest value, and its tile
    best_tile = tl.zeros((NC, 4), tl.int32)
    nan_seen = tl.full((NC, 4), float("-inf"), tl.float32)
    offs = tile_offsets(start, NC)
    upcoming = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf"))
    for t in range(NUM_TILES):
        logits = upcoming.to(tl.float32)
        ahead = offs + (t + 1) * TILE
        upcoming = tl.load(row_ptr + ahead, mask=(ahead < vocab_size) & (t + 1 < NUM_TILES), other=float("-inf"))
        better = logits > best  # strict: a later equal value keeps the first
        best = tl.where(better, logits, best)
        best_tile = tl.where(better, t, best_tile)
        nan_seen = tl.maximum(nan_seen, logits, propagate_nan=tl.PropagateNan.ALL)
    key = tl.max(tl.max(score_key(best, offs + best_tile * TILE, False), axis=1), axis=0)
    if tl.max(tl.max((nan_seen != nan_seen).to(tl.int32), axis=1), axis=0) > 0:  # rare: find the first NaN
        first = tl.full((NC, 4), 2147483647, tl.int32)
        for t in range(NUM_TILES):
            logits = tl.load(row_ptr + offs + t * TILE, mask=offs + t * TILE < vocab_size, other=0.0).to(tl.float32)
            first = tl.minimum(first, tl.where(logits != logits, offs + t * TILE, 2147483647))
        nan = tl.full((), float("nan"), tl.float32)
        key = score_key(nan, tl.min(tl.min(first, axis=1), axis=0), True)
    return key


@triton.jit
def _finish(best_key, row, split, out_ptr, partial_ptr, counter_ptr, num_splits, SPLITS_P2: tl.constexpr):
    """Write the row's token: directly, or, for split rows, by the row's last program to finish."""
    if SPLITS_P2 == 1:
        tl.store(out_ptr + row, key_token(best_key).to(tl.int64))
    else:
        tl.store(partial_ptr + row * num_splits + split, best_key)
        tl.debug_barrier()
        # release: the partial is visible before the count; acquire: the last sees every partial
        finished = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
        if finished == num_splits - 1:
            splits = tl.arange(0, SPLITS_P2)
            keys = tl.load(partial_ptr + row * num_splits + splits, mask=splits < num_splits, other=KEY_NONE,
                           cache_modifier=".cg")
            tl.store(out_ptr + row, key_token(tl.max(keys, axis=0)).to(tl.int64))
            tl.store(counter_ptr + row, 0)  # ready for the next launch


@triton.jit
def argmax_kernel(logits_ptr, stride, out_ptr, partial_ptr, counter_ptr, vocab_size, num_splits,
                  NUM_TILES: tl.constexpr, TILE: tl.constexpr, SPLITS_P2: tl.constexpr):
    """A greedy batch: each row's first maximum (few arguments: the launch is what a batch-1 step pays for)."""
    row, split = tl.program_id(0), tl.program_id(1)
    start = split * (NUM_TILES * TILE)
    best_key = _argmax_keys(logits_ptr + row.to(tl.int64) * stride, start, vocab_size, NUM_TILES, TILE)
    _finish(best_key, row, split, out_ptr, partial_ptr, counter_ptr, num_splits, SPLITS_P2)


@triton.jit(do_not_specialize=["gen_seed", "gen_counter"])
def sample_kernel(logits_ptr, stride, out_ptr, partial_ptr, counter_ptr, temperature_ptr, temperature_value,
                  seed_ptr, position_ptr, is_seeded_ptr, gen_seed: tl.int64, gen_counter: tl.int64,
                  min_p_ptr, row_max_ptr, threshold_ptr, num_ties_ptr, tie_counts_ptr, vocab_size, num_splits,
                  UNIFORM_TEMPERATURE: tl.constexpr, HAS_SEEDS: tl.constexpr, HAS_MIN_P: tl.constexpr,
                  HAS_THRESHOLD: tl.constexpr, MIN_TEMPERATURE: tl.constexpr, SMALL_V: tl.constexpr,
                  NUM_TILES: tl.constexpr, NUM_TILES_P2: tl.constexpr, TILE: tl.constexpr,
                  SPLITS_P2: tl.constexpr, NATIVE: tl.constexpr):
    """A sampled batch (greedy rows among sampled ones included)."""
    row, split = tl.program_id(0), tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    start = split * (NUM_TILES * TILE)
    if UNIFORM_TEMPERATURE:
        temperature = temperature_value
    else:
        temperature = tl.load(temperature_ptr + row)
    best_key = _sample_row(row, row_ptr, start, split, temperature, seed_ptr, position_ptr, is_seeded_ptr,
                           gen_seed, gen_counter, min_p_ptr, row_max_ptr, threshold_ptr, num_ties_ptr,
                           tie_counts_ptr, vocab_size, num_splits, HAS_SEEDS, HAS_MIN_P, HAS_THRESHOLD,
                           MIN_TEMPERATURE, SMALL_V, NUM_TILES, NUM_TILES_P2, TILE, SPLITS_P2, NATIVE)
    _finish(best_key, row, split, out_ptr, partial_ptr, counter_ptr, num_splits, SPLITS_P2)


@triton.jit
def _sample_row(row, row_ptr, start, split, temperature, seed_ptr, position_ptr, is_seeded_ptr, gen_seed,
                gen_counter, min_p_ptr, row_max_ptr, threshold_ptr, num_ties_ptr, tie_counts_ptr, vocab_size,
                num_splits, HAS_SEEDS: tl.constexpr, HAS_MIN_P: tl.constexpr, HAS_THRESHOLD: tl.constexpr,
                MIN_TEMPERATURE: tl.constexpr, SMALL_V: tl.constexpr, NUM_TILES: tl.constexpr,
                NUM_TILES_P2: tl.constexpr, TILE: tl.constexpr, SPLITS_P2: tl.constexpr, NATIVE: tl.constexpr):
    """The best key of one row's slice (greedy or sampled)."""
    if temperature < MIN_TEMPERATURE:
        # a greedy row: the cut (at t = 1) and min-p always keep the first maximum, so it is the argmax
        best_key = _argmax_keys(row_ptr, start, vocab_size, NUM_TILES, TILE)
    else:
        best_key = _sampled_key(row, row_ptr, start, split, temperature, seed_ptr, position_ptr, is_seeded_ptr,
                                gen_seed, gen_counter, min_p_ptr, row_max_ptr, threshold_ptr, num_ties_ptr,
                                tie_counts_ptr, vocab_size, num_splits, HAS_SEEDS, HAS_MIN_P, HAS_THRESHOLD, SMALL_V,
                                NUM_TILES, NUM_TILES_P2, TILE, SPLITS_P2, NATIVE)
    return best_key


@triton.jit
def _sampled_key(row, row_ptr, start, split, temperature, seed_ptr, position_ptr, is_seeded_ptr, gen_seed,
                 gen_counter, min_p_ptr, row_max_ptr, threshold_ptr, num_ties_ptr, tie_counts_ptr, vocab_size,
                 num_splits, HAS_SEEDS: tl.constexpr, HAS_MIN_P: tl.constexpr, HAS_THRESHOLD: tl.constexpr,
                 SMALL_V: tl.constexpr, NUM_TILES: tl.constexpr, NUM_TILES_P2: tl.constexpr, TILE: tl.constexpr,
                 SPLITS_P2: tl.constexpr, NATIVE: tl.constexpr):
    """The best key of a sampled row's slice: pass A (bounds), then pass B (exact scores, best bound first)."""
    NC: tl.constexpr = TILE // 4
    # unseeded rows: a fresh key per launch from the generator's (seed, offset), position 0
    r0, r1, _, _ = tl.randint4x(gen_seed, (gen_counter << 32) | row.to(tl.int64))
    key = r0.to(tl.int64) | (r1.to(tl.int64) << 32)
    position = tl.zeros((), tl.int64)
    if HAS_SEEDS:
        is_seeded = tl.load(is_seeded_ptr + row) != 0
        key = tl.where(is_seeded, tl.load(seed_ptr + row), key)
        position = tl.where(is_seeded, tl.load(position_ptr + row), position)
    lo = tl.zeros((), tl.float32)
    hi = tl.zeros((), tl.float32)
    floor_lo = tl.zeros((), tl.float32)
    if HAS_THRESHOLD:
        lo, hi = tie_interval(tl.load(threshold_ptr + row), temperature)
    if HAS_MIN_P:  # keep z >= z_max + log(min_p), i.e. p >= min_p * p_max
        floor = tl.math.div_rn(tl.load(row_max_ptr + row), temperature) + tl.log(tl.load(min_p_ptr + row))
        floor_lo = order_to_float(smallest_reaching(floor, temperature, False))
    bounds, num_local_ties = _bounds(row_ptr, start, vocab_size, temperature, key, position, lo, hi, floor_lo,
                                     HAS_THRESHOLD, HAS_MIN_P, NUM_TILES, TILE, NATIVE)
    tau = tl.full((), 2147483647, tl.int32)  # ties kept up to this token
    if HAS_THRESHOLD:  # the first num_ties ties of the row (in token order) are kept
        needed = tl.load(num_ties_ptr + row)
        if SPLITS_P2 > 1:
            splits = tl.arange(0, SPLITS_P2)
            before = tl.load(tie_counts_ptr + row * num_splits + splits, mask=splits < split, other=0)
            needed -= tl.sum(before, axis=0)
        tau = tl.where(needed >= num_local_ties, tau, -1)
        if (needed > 0) & (needed < num_local_ties):
            tau = nth_tie(row_ptr, start, vocab_size, lo, hi, needed, NUM_TILES, TILE)
    # Pass B: exact scores of the groups whose bound may still win, highest bound first
    best_key = tl.full((), KEY_NONE, tl.int64)
    best = tl.full((), float("-inf"), tl.float32)
    top, group = tl.max(bounds, axis=0, return_indices=True)
    while (top > float("-inf")) & (bound_margin(top) >= best):
        candidate = group_key(row_ptr, start, group, vocab_size, temperature, key, position, lo, hi, tau, floor_lo,
                              HAS_THRESHOLD, HAS_MIN_P, SMALL_V, NUM_TILES, NUM_TILES_P2, TILE, NATIVE)
        best_key = tl.maximum(best_key, candidate)
        best = key_score(best_key)
        bounds = tl.where(tl.arange(0, NC) == group, float("-inf"), bounds)
        top, group = tl.max(bounds, axis=0, return_indices=True)
    # Where no token of the slice scores above -inf, every key ties at -inf and the lowest token, the slice's
    # first, wins, as it would had every group been scored; a finite score's key is above it.
    return tl.maximum(best_key, score_key(tl.full((), float("-inf"), tl.float32), start, False))


@triton.jit
def count_ties_kernel(logits_ptr, stride, temperature_ptr, threshold_ptr, counts_ptr, vocab_size, num_splits,
                      MIN_TEMPERATURE: tl.constexpr, NUM_TILES: tl.constexpr, TILE: tl.constexpr):
    """counts[row, split] = tokens of the slice whose scaled logit equals the row's threshold."""
    row, split = tl.program_id(0), tl.program_id(1)
    NC: tl.constexpr = TILE // 4
    temperature = tl.load(temperature_ptr + row)
    temperature = tl.where(temperature < MIN_TEMPERATURE, 1.0, temperature)
    lo, hi = tie_interval(tl.load(threshold_ptr + row), temperature)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    start = split * (NUM_TILES * TILE)
    count = tl.zeros((NC, 4), tl.int32)
    for t in range(NUM_TILES):
        offs = tile_offsets(start + t * TILE, NC)
        logits = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        count += ((logits >= lo) & (logits <= hi) & (offs < vocab_size)).to(tl.int32)
    tl.store(counts_ptr + row * num_splits + split, tl.sum(tl.sum(count, axis=1), axis=0))
