"""Split-K decode against a float64 reference: ragged contexts, block edges, GQA, splits, windows."""

from __future__ import annotations

import pytest
import torch

from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.testing import make_paged_batch, reference_attention, relative_error, write_new_tokens
from infer_attention_triton.tiles import FP8_PROGRAMS_PER_SM, DecodeTiles, choose_num_splits


def run_decode(batch, scale, num_splits, block_n, sliding_window=None, req_order=None):
    num_seqs, num_heads, head_dim = batch.q.shape
    out = torch.full_like(batch.q, float("nan"))
    scratch = SplitScratch.allocate(num_seqs, num_heads, num_splits, head_dim, batch.q.device)
    md = batch.metadata
    decode_attention(
        batch.q,
        batch.kv_cache,
        md.block_tables,
        md.seq_lens,
        out,
        scale=scale,
        num_splits=num_splits,
        tiles=DecodeTiles(block_n, 4, 2),
        sliding_window=sliding_window,
        scratch=scratch,
        req_order=req_order,
    )
    return out


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_launch_order_changes_no_bit(device, num_splits):
    """Programs launched longest context first (BatchMetadata.decode_order) write what batch order writes."""
    contexts = [3, 70, 17, 40, 0]
    batch = make_paged_batch(contexts, [1] * len(contexts), num_heads=4, num_kv_heads=2, head_dim=32,
                             block_size=16, device=device, seed=7)
    write_new_tokens(batch)
    order = torch.tensor(sorted(range(len(contexts)), key=lambda i: -contexts[i]), dtype=torch.int32, device=device)
    in_order = run_decode(batch, 0.2, num_splits, 16, req_order=order)
    assert torch.equal(in_order, run_decode(batch, 0.2, num_splits, 16))
    assert relative_error(in_order, reference_attention(batch, 0.2)) < 1e-5


# Contexts (before the new token) of 0 and 1, a block exactly, a block +-1, and a few blocks.
EDGE_CONTEXTS = [0, 1, 15, 16, 17, 31, 32, 33, 70]


@pytest.mark.parametrize("num_splits", [1, 2, 3, 16])
@pytest.mark.parametrize("block_n", [16, 32])  # 32 over 16-token pages looks up a page per token
def test_decode_float32_edges(device, num_splits, block_n):
    batch = make_paged_batch(
        EDGE_CONTEXTS,
        [1] * len(EDGE_CONTEXTS),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=16,
        device=device,
        seed=num_splits,
    )
    write_new_tokens(batch)
    out = run_decode(batch, 0.17, num_splits, block_n)
    assert relative_error(out, reference_attention(batch, 0.17)) < 1e-5


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (4, 2), (8, 2), (8, 1), (16, 2)])
@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 16), (128, 32), (256, 16), (16, 64)])
def test_decode_float32_gqa_and_shapes(device, num_heads, num_kv_heads, head_dim, block_size):
    contexts = [5, block_size - 1, 3 * block_size, 2 * block_size + 7]
    batch = make_paged_batch(
        contexts,
        [1] * 4,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        device=device,
        seed=head_dim + num_heads,
    )
    write_new_tokens(batch)
    scale = head_dim**-0.5
    out = run_decode(batch, scale, 2, 16)
    assert relative_error(out, reference_attention(batch, scale)) < 1e-5


@pytest.mark.parametrize("sliding_window", [1, 7, 16, 40])
def test_decode_sliding_window(device, sliding_window):
    batch = make_paged_batch(
        [0, 6, 16, 50, 90],
        [1] * 5,
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        block_size=16,
        device=device,
        seed=sliding_window,
    )
    write_new_tokens(batch)
    out = run_decode(batch, 0.2, 4, 16, sliding_window)
    assert relative_error(out, reference_attention(batch, 0.2, sliding_window)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_precision(device, dtype):
    batch = make_paged_batch(
        [3, 40, 77],
        [1] * 3,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=32,
        dtype=dtype,
        device=device,
        seed=1,
    )
    write_new_tokens(batch)
    out = run_decode(batch, 0.125, 2, 16)
    assert out.dtype == dtype
    assert relative_error(out, reference_attention(batch, 0.125)) < 1e-2


def test_split_count_fills_the_gpu_and_stays_bounded():
    # Few long requests are split; a batch that already fills 132 SMs is not.
    assert choose_num_splits(1, 8, 32768, 132, 64) == 64
    assert choose_num_splits(8, 8, 8192, 132, 64) == 8
    assert choose_num_splits(256, 8, 8192, 132, 64) == 1
    # Short contexts are not cut into slivers: at least 4 tiles per split.
    assert choose_num_splits(1, 8, 512, 132, 64) == 2
    assert choose_num_splits(1, 8, 64, 132, 64) == 1
    for num_seqs in (1, 3, 8, 64, 256):
        splits = choose_num_splits(num_seqs, 8, 32768, 132, 64)
        assert splits & (splits - 1) == 0 and 1 <= splits <= 64
    # An FP8 cache's programs aim at four an SM: 32 requests of 8,000 tokens over 8 KV heads take 4 splits, not 2.
    assert choose_num_splits(32, 8, 8000, 132, 128) == 2
    assert choose_num_splits(32, 8, 8000, 132, 128, FP8_PROGRAMS_PER_SM) == 4
    assert choose_num_splits(256, 8, 2000, 132, 128, FP8_PROGRAMS_PER_SM) == 1
