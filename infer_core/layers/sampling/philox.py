"""Counter-based noise for the exponential race: Philox4x32-10, keyed by (seed, position, token).

A seeded request's noise for token ``v`` at output position ``pos`` is a pure function of
(seed, pos, v): no generator state, so it cannot depend on the batch or on preemption, and every
row of a batch is computed at once. The Triton kernel (``fused.py``) runs the same rounds as
``triton.language.randint4x`` with ``offset = pos * 2**32 + v // 4``; this module is the torch twin for
the CPU (and for CUDA without Triton), and the two give the same 32-bit draws.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFF_FFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the key
NUM_ROUNDS = 10
SMALL_V = 2.0 ** -6  # below this, -log(1 - v) comes from its series, which keeps its precision


def seed_key(seed: int) -> int:
    """A request's seed (any Python int) as the signed 64-bit Philox key, seed mod 2**64."""
    key = seed & 0xFFFF_FFFF_FFFF_FFFF
    return key - (1 << 64) if key >= 1 << 63 else key


def _mulhilo(a: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * multiplier`` (a < 2**32) without overflowing int64."""
    low_product = (a & 0xFFFF) * multiplier  # < 2**48
    high_product = (a >> 16) * multiplier  # < 2**48
    hi = (high_product + (low_product >> 16)) >> 16
    lo = (low_product + ((high_product & 0xFFFF) << 16)) & _MASK32
    return hi, lo


def philox4x32(keys: torch.Tensor, counters: torch.Tensor, positions: torch.Tensor) -> list[torch.Tensor]:
    """The four 32-bit outputs (int64 tensors [R, C]) for counters (c, pos, 0, 0) under each row's key.

    ``keys``: [R] int64 (two's complement of the unsigned key); ``counters``: [C]; ``positions``: [R] >= 0.
    """
    k0 = (keys & _MASK32).unsqueeze(1)
    k1 = ((keys >> 32) & _MASK32).unsqueeze(1)
    c0 = counters.to(torch.int64).unsqueeze(0).expand(len(keys), -1)
    c1 = (positions.to(torch.int64) & _MASK32).unsqueeze(1).expand_as(c0)
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(NUM_ROUNDS):
        hi_b, lo_b = _mulhilo(c2, _ROUND_B)
        hi_a, lo_a = _mulhilo(c0, _ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return [c0, c1, c2, c3]


def philox_uint32(keys: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, V] int64 32-bit draws: token ``v`` takes output ``v % 4`` of counter ``v // 4``.

    One Philox evaluation serves four tokens (the kernel's ``randint4x``), a quarter of the work.
    """
    counters = torch.arange(-(-vocab_size // 4), device=keys.device)
    outputs = philox4x32(keys, counters, positions)
    return torch.stack(outputs, dim=2).reshape(len(keys), -1)[:, :vocab_size]


def exponential_from_uint32(bits: torch.Tensor) -> torch.Tensor:
    """Exp(1) draws from 32-bit integers: ``-log(1 - v)`` with ``v = (bits + 1/2) / 2**32`` in (0, 1).

    Small ``v`` (the draws that decide the race) go through the series ``v + v²/2 + v³/3 + v⁴/4``,
    so no draw is rounded to 0 (an infinite score), which ``-log(u)`` with ``u`` near 1 would do.
    """
    v = (bits.to(torch.float32) + 0.5) * 2.0 ** -32
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0 + v * 0.25)))
    return torch.where(v < SMALL_V, series, -torch.log(1.0 - v))


def seeded_exponential(keys: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, V] float32 Exp(1) noise of each row's (key, position) stream."""
    return exponential_from_uint32(philox_uint32(keys, positions, vocab_size))
