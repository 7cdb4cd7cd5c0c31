"""Tile shapes per head_dim and the decode split count: the host-side choices made once per step."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class DecodeTiles:
    block_n: int  # context tokens per loop iteration
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class PrefillTiles:
    block_m: int  # query tokens per program
    block_n: int  # keys per loop iteration
    num_warps: int
    num_stages: int


def is_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def decode_tiles(head_dim: int, kv_fp8: bool = False) -> DecodeTiles:
    """An FP8 cache's tiles hold half the bytes: 128 keys a step, which measured faster than 64
    (``benchmarks/kv_fp8_decode_sweep.py``)."""
    if is_interpreted():  # numpy runs every program: small tiles keep the CPU tests fast
        return DecodeTiles(block_n=16, num_warps=1, num_stages=1)
    if head_dim >= 256:
        return DecodeTiles(block_n=32, num_warps=4, num_stages=3)
    return DecodeTiles(block_n=128 if kv_fp8 else 64, num_warps=4, num_stages=3)


def prefill_tiles(head_dim: int, page_size: int, kv_fp8: bool = False) -> PrefillTiles:
    """The fastest of ``benchmarks/attention.py --sweep`` (bfloat16, head_dim 128, 8 x 2048 tokens). An FP8 cache's
    key tiles hold half the bytes and each is converted before its dots: 128 keys a step, which measured fastest
    on a long-context step (the results' ``kv-fp8-long-context-h100-2026-11-28/attn_sweep.py``)."""
    if is_interpreted():
        return PrefillTiles(block_m=16, block_n=16, num_warps=1, num_stages=1)
    if head_dim >= 256:
        return PrefillTiles(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if page_size < 64:  # a page lookup per key: more warps hide the dependent loads
        return PrefillTiles(block_m=128, block_n=128 if kv_fp8 else 64, num_warps=8, num_stages=2)
    return PrefillTiles(block_m=128, block_n=64, num_warps=4, num_stages=3)


def dot_precision(dtype: torch.dtype) -> str:
    """float32 caches are for accuracy (and the interpreter): no TF32 rounding in their dots."""
    return "ieee" if dtype == torch.float32 else "tf32"


MAX_SPLITS = 64
MIN_TILES_PER_SPLIT = 4
PROGRAMS_PER_SM = 2
FP8_PROGRAMS_PER_SM = 4


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int, block_n: int,
                      programs_per_sm: int = PROGRAMS_PER_SM) -> int:
    """Splits of the context per (request, KV head) so that the decode grid fills the GPU.

    Aims at about ``programs_per_sm`` programs per SM: two over a cache in the model's dtype; four over an FP8
    one, whose programs convert each tile before their dots (32 requests of 8,000 tokens, 8 KV heads, on an
    H100: 2 splits 261-269 us, 4 splits 216-219, ``kv-fp8-long-context-h100-2026-11-28``). A split keeps at
    least ``MIN_TILES_PER_SPLIT`` tiles so the merge stays cheap next to the reads. A power of two, so few
    kernel variants exist.
    """
    programs = max(1, num_seqs * num_kv_heads)
    wanted = -(-programs_per_sm * num_sms // programs)
    most = max(1, -(-max_seq_len // block_n) // MIN_TILES_PER_SPLIT)
    splits = max(1, min(wanted, most, MAX_SPLITS))
    return 1 << (splits - 1).bit_length() if splits > 1 else 1
