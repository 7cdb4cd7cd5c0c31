"""Prefill/extend against a float64 reference: ragged chunks, prefix hits, chunk boundaries, windows."""

from __future__ import annotations

import pytest
import torch

from infer_attention_triton.prefill import prefill_attention
from infer_attention_triton.testing import make_paged_batch, reference_attention, relative_error, write_new_tokens
from infer_attention_triton.tiles import PrefillTiles


def run_prefill(batch, scale, tiles, sliding_window=None):
    md = batch.metadata
    out = torch.full_like(batch.q, float("nan"))
    prefill_attention(
        batch.q,
        batch.kv_cache,
        md.block_tables,
        md.seq_lens,
        md.query_start_loc,
        out,
        scale=scale,
        first_req=0,
        num_reqs=md.num_reqs,
        max_query_len=md.max_query_len,
        tiles=tiles,
        sliding_window=sliding_window,
    )
    return out


TILES = [PrefillTiles(16, 16, 4, 1), PrefillTiles(32, 16, 4, 1), PrefillTiles(16, 32, 4, 1)]


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"m{t.block_m}n{t.block_n}")
def test_prefill_float32_ragged(device, tiles):
    # Whole prompts (no context), prefix hits (context a whole number of blocks), and chunks that
    # start mid-block (chunked prefill), with query lengths around the tile sizes.
    contexts = [0, 0, 16, 32, 5, 17, 31, 0]
    queries = [2, 17, 16, 9, 33, 15, 1 + 1, 40]
    batch = make_paged_batch(
        contexts,
        queries,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=16,
        device=device,
        seed=tiles.block_m + tiles.block_n,
    )
    write_new_tokens(batch)
    out = run_prefill(batch, 0.2, tiles)
    assert relative_error(out, reference_attention(batch, 0.2)) < 1e-5


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(2, 2, 64, 16), (8, 1, 32, 32), (8, 2, 128, 16), (4, 2, 256, 64), (16, 2, 16, 16)],
)
def test_prefill_float32_shapes(device, num_heads, num_kv_heads, head_dim, block_size):
    batch = make_paged_batch(
        [0, block_size, block_size + 3],
        [19, 5, 24],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        device=device,
        seed=head_dim,
    )
    write_new_tokens(batch)
    scale = head_dim**-0.5
    out = run_prefill(batch, scale, PrefillTiles(16, 16, 4, 1))
    assert relative_error(out, reference_attention(batch, scale)) < 1e-5


@pytest.mark.parametrize("sliding_window", [1, 5, 16, 23])
def test_prefill_sliding_window(device, sliding_window):
    batch = make_paged_batch(
        [0, 20, 45],
        [37, 18, 12],
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=16,
        device=device,
        seed=sliding_window,
    )
    write_new_tokens(batch)
    out = run_prefill(batch, 0.2, PrefillTiles(16, 16, 4, 1), sliding_window)
    assert relative_error(out, reference_attention(batch, 0.2, sliding_window)) < 1e-5


def test_prefill_writes_only_its_requests(device):
    """first_req/num_reqs pick a slice of the batch; other rows of out are left alone."""
    batch = make_paged_batch(
        [4, 9, 0], [1, 1, 20], num_heads=2, num_kv_heads=1, head_dim=32, block_size=16, device=device
    )
    write_new_tokens(batch)
    md = batch.metadata
    out = torch.full_like(batch.q, 7.0)
    prefill_attention(
        batch.q,
        batch.kv_cache,
        md.block_tables,
        md.seq_lens,
        md.query_start_loc,
        out,
        scale=0.3,
        first_req=2,
        num_reqs=1,
        max_query_len=20,
        tiles=PrefillTiles(16, 16, 4, 1),
    )
    assert bool((out[:2] == 7.0).all())
    assert relative_error(out[2:], reference_attention(batch, 0.3)[2:]) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_half_precision(device, dtype):
    batch = make_paged_batch(
        [0, 16, 7],
        [30, 12, 20],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        device=device,
        seed=2,
    )
    write_new_tokens(batch)
    out = run_prefill(batch, 0.125, PrefillTiles(16, 16, 4, 1))
    assert out.dtype == dtype
    assert relative_error(out, reference_attention(batch, 0.125)) < 1e-2
