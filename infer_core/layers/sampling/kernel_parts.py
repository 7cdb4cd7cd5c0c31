"""Triton building blocks of the fused sampler: order keys, Philox tiles, exact cut bounds, one exact group.

Every winner is an int64 *key*: the score's float32 order in the high word and ``2**31 - 1 - token``
in the low word, so one integer maximum picks the highest score and, among equal scores, the lowest
token (what the old in-order scan with a strict ``>`` picked); partial results of programs combine
the same way. Importing this module imports triton.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

# (constexpr: the only module globals a compiled kernel may read)
FLT_MAX = tl.constexpr(3.4028234663852886e38)
LN2 = tl.constexpr(0.6931471805599453)
LOG2E = tl.constexpr(1.4426950408889634)
ORD_NEG_INF = tl.constexpr(-2139095041)  # _ordered(-inf)
ORD_POS_INF = tl.constexpr(2139095040)  # _ordered(+inf)
ORD_NAN_FIRST = tl.constexpr(2147483647)  # above every float: a greedy row's NaN (torch's argmax takes the first)
LOW_TOKEN = tl.constexpr(2147483647)  # low word of a key: LOW_TOKEN - token
# key(-inf, token 0): a row whose every score is -inf samples token 0, as the old kernel and torch did
KEY_NONE = tl.constexpr(-2139095041 * 4294967296 + 2147483647)
PHILOX_ROUND_A = tl.constexpr(0xD2511F53)
PHILOX_ROUND_B = tl.constexpr(0xCD9E8D57)
PHILOX_KEY_A = tl.constexpr(0x9E3779B9)
PHILOX_KEY_B = tl.constexpr(0xBB67AE85)


@triton.jit
def _ordered(x):
    """float32 -> int32 whose signed order is the float order (-0.0 just below +0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _unordered(o):
    """The inverse of ``_ordered`` (int32 -> float32)."""
    return (o ^ ((o >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def order_to_float(order):
    """The float32 of an ordered int64 from ``smallest_reaching`` (out of range: a NaN)."""
    return _unordered(order.to(tl.int32))


@triton.jit
def score_key(score, token, nan_wins):
    """int64 keys of (score, token): NaN is above everything where ``nan_wins`` (greedy), -inf otherwise."""
    score = tl.where(score == 0.0, 0.0, score)  # -0.0 == +0.0: the lower token wins, as float comparisons say
    nan_high = tl.where(nan_wins, tl.full(score.shape, ORD_NAN_FIRST, tl.int32),
                        tl.full(score.shape, ORD_NEG_INF, tl.int32))
    high = tl.where(score != score, nan_high, _ordered(score))
    return (high.to(tl.int64) << 32) | (-token + LOW_TOKEN).to(tl.int64)


@triton.jit
def key_token(key):
    return -key.to(tl.int32) + LOW_TOKEN  # the low word (truncation keeps it)


@triton.jit
def key_score(key):
    """The score of a (sampled row's) key, as float32."""
    return _unordered((key >> 32).to(tl.int32))


@triton.jit
def _reaches(order, target, temperature, STRICT: tl.constexpr):
    z = tl.math.div_rn(_unordered(order.to(tl.int32)), temperature)
    if STRICT:
        return z > target
    return z >= target


@triton.jit
def smallest_reaching(target, temperature, STRICT: tl.constexpr):
    """The smallest float32 ``l`` (as an ordered int64) with ``div_rn(l, t) >= target`` (``>`` if STRICT).

    ``div_rn(., t)`` is monotone, so the logits whose scaled value compares with ``target`` in a
    given way form an interval: a binary search over float orders finds its end exactly, and the
    tiles then compare raw logits with it instead of dividing each one. The end lies within a few
    orders of ``target * t``, so the search starts there when that bracket provably holds it, and
    over all 2**32 orders otherwise. Returns ORD_POS_INF + 1 (a NaN, which compares false) when no
    float qualifies (``target`` NaN).
    """
    none = tl.full((), ORD_POS_INF + 1, tl.int64)
    guess = tl.minimum(tl.maximum(_ordered(target * temperature).to(tl.int64), ORD_NEG_INF + 8), ORD_POS_INF - 7)
    lo = guess - 8  # the answer is in [lo, hi] if nothing below lo qualifies and hi does
    hi = guess + 8
    holds = ((lo == ORD_NEG_INF) | (_reaches(lo - 1, target, temperature, STRICT) == 0)) & \
        _reaches(hi, target, temperature, STRICT)
    lo = tl.where(holds, lo, ORD_NEG_INF)
    hi = tl.where(holds, hi, none)
    while lo < hi:
        mid = (lo + hi) >> 1
        ok = _reaches(mid, target, temperature, STRICT)
        hi = tl.where(ok, mid, hi)
        lo = tl.where(ok, lo, mid + 1)
    return lo


@triton.jit
def tie_interval(threshold, temperature):
    """(lo, hi) float32: ``div_rn(l, t) == threshold`` exactly when lo <= l <= hi; ``> threshold`` when l > hi."""
    lo = smallest_reaching(threshold, temperature, False)
    above = smallest_reaching(threshold, temperature, True)
    return order_to_float(lo), order_to_float(above - 1)


@triton.jit
def tile_offsets(tile_start, NC: tl.constexpr):
    """[NC, 4] token offsets of a tile: row c holds the four tokens of Philox counter ``tile_start // 4 + c``."""
    return tile_start + tl.arange(0, NC)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _mul_wide(a, multiplier):
    """(high, low) 32-bit words of ``a * multiplier``, one ``mul.wide.u32`` (an IMAD.WIDE, not IMAD.HI + IMAD)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b64 wide; mul.wide.u32 wide, $2, $3; mov.b64 {$1, $0}, wide; }", "=r,=r,r,r",
        [a, tl.full(a.shape, multiplier, tl.uint32)], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)


@triton.jit
def _philox(key, counter_lo, counter_hi, NATIVE: tl.constexpr):
    """Philox4x32-10 of counters (counter_lo, counter_hi, 0, 0) under ``key``: ``tl.randint4x``'s rounds."""
    if NATIVE:
        key = key.to(tl.uint64, bitcast=True)
        k0 = (key & 0xFFFFFFFF).to(tl.uint32)
        k1 = (key >> 32).to(tl.uint32)
        c0 = counter_lo.to(tl.uint32)
        c1 = tl.zeros_like(c0) + counter_hi.to(tl.uint32)
        c2 = tl.zeros_like(c0)
        c3 = tl.zeros_like(c0)
        for _ in tl.static_range(10):
            hi_b, lo_b = _mul_wide(c2, PHILOX_ROUND_B)
            hi_a, lo_a = _mul_wide(c0, PHILOX_ROUND_A)
            c0 = hi_b ^ c1 ^ k0
            c2 = hi_a ^ c3 ^ k1
            c1 = lo_b
            c3 = lo_a
            k0 = k0 + PHILOX_KEY_A
            k1 = k1 + PHILOX_KEY_B
        return c0, c1, c2, c3
    return tl.randint4x(key, (counter_hi.to(tl.int64) << 32) + counter_lo)


@triton.jit
def noise_bits(key, position, counters, NATIVE: tl.constexpr):
    """[N, 4] uint32 draws: token ``4c + j`` takes output ``j`` of Philox counter (c, position).

    NATIVE (compiled for the GPU): the rounds with ``mul.wide`` inline PTX; the interpreter runs
    ``tl.randint4x``, the same rounds.
    """
    r0, r1, r2, r3 = _philox(key, counters, position, NATIVE)
    j = tl.arange(0, 4)[None, :]
    return tl.where(j == 0, r0[:, None], tl.where(j == 1, r1[:, None], tl.where(j == 2, r2[:, None], r3[:, None])))


@triton.jit
def noise_bound(bits, NATIVE: tl.constexpr):
    """An upper bound of ``-log2(q)`` for the Exp(1) draw ``q`` of ``bits``, from one fast log2.

    ``q >= v >= u`` with ``u`` = the top 23 bits over 2**23 (``q = -log(1 - v) >= v`` and the
    series branch is ``v`` times a factor >= 1), so ``-log2(u) >= -log2(q)``; ``u == 0`` gives +inf.
    NATIVE: the GPU's approximate log2 (one MUFU instruction; its error is in ``bound_margin``);
    the interpreter, which runs no libdevice, takes the exact one.
    """
    u = ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 1.0
    if NATIVE:
        return -libdevice.fast_log2f(u)
    return -tl.log2(u)


@triton.jit
def bound_margin(bound):
    """What the exact score of an element may exceed its bound by (rounding of z, log and the fast log2).

    Monotone in ``bound``, so it may be applied to a maximum of bounds. The errors are below
    2**-20 * (|bound| + 50); this allows 16 times that.
    """
    return bound + (tl.abs(bound) + 55.0) * 1.52587890625e-05


@triton.jit
def exact_scores(logits, bits, temperature, SMALL_V: tl.constexpr):
    """The old kernel's scores of a sampled row, operation for operation: ``z - log(q)``."""
    z = tl.math.div_rn(logits, tl.full(logits.shape, 1.0, tl.float32) * temperature)
    v = (bits.to(tl.float32) + 0.5) * 2.3283064365386963e-10  # (bits + 1/2) / 2**32, in (0, 1)
    series = v * (1.0 + v * (0.5 + v * (0.3333333432674408 + v * 0.25)))
    exponential = tl.where(v < SMALL_V, series, -tl.log(1.0 - v))
    return z - tl.log(exponential)


@triton.jit
def group_key(row_ptr, start, group, vocab_size, temperature, key, position, lo, hi, tau, floor_lo,
              HAS_THRESHOLD: tl.constexpr, HAS_MIN_P: tl.constexpr, SMALL_V: tl.constexpr,
              NUM_TILES: tl.constexpr, NUM_TILES_P2: tl.constexpr, TILE: tl.constexpr, NATIVE: tl.constexpr):
    """The best key among the tokens at counter ``group`` of every tile of this program, scored exactly."""
    tile = tl.arange(0, NUM_TILES_P2)
    counters = (start + tile * TILE) // 4 + group
    offs = counters[:, None] * 4 + tl.arange(0, 4)[None, :]
    valid = (tile[:, None] < NUM_TILES) & (offs < vocab_size)
    logits = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
    keep = valid
    if HAS_THRESHOLD:  # above the cut, or tied at it among the first ties (token <= tau)
        keep = keep & ((logits > hi) | ((logits >= lo) & (logits <= hi) & (offs <= tau)))
    if HAS_MIN_P:
        keep = keep & (logits >= floor_lo)
    score = exact_scores(logits, noise_bits(key, position, counters, NATIVE), temperature, SMALL_V)
    score = tl.where(keep, score, float("-inf"))
    return tl.max(score_key(score, offs, False))


@triton.jit
def nth_tie(row_ptr, start, vocab_size, lo, hi, n, NUM_TILES: tl.constexpr, TILE: tl.constexpr):
    """The token of the ``n``-th (1-based) logit in [lo, hi] of this program's slice, in token order."""
    NC: tl.constexpr = TILE // 4
    remaining = n
    found = tl.full((), 2147483647, tl.int32)
    for t in range(NUM_TILES):
        offs = tile_offsets(start + t * TILE, NC)
        logits = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        ties = ((logits >= lo) & (logits <= hi) & (offs < vocab_size)).to(tl.int32)
        per_counter = tl.sum(ties, axis=1)
        count = tl.sum(per_counter, axis=0)
        if (remaining > 0) & (remaining <= count):
            rank = (tl.cumsum(per_counter, axis=0) - per_counter)[:, None] + tl.cumsum(ties, axis=1)
            found = tl.min(tl.where((ties == 1) & (rank == remaining), offs, 2147483647))
        remaining -= count
    return found
