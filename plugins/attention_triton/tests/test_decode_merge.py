"""Split-K decode merged in the same launch (the last split program of a request and KV head merges)
against the two-launch merge, bit for bit, and against the float64 reference.

Under the interpreter the programs run one after another, so these tests check the counting, the
merge arithmetic and the counter reset, not the races: ``test_decode_merge_gpu.py`` replays the
launch many times on a GPU for those.
"""

from __future__ import annotations

import pytest
import torch

from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.testing import make_paged_batch, reference_attention, relative_error, write_new_tokens
from infer_attention_triton.tiles import DecodeTiles

TILES = DecodeTiles(16, 1, 1)


def decode(batch, scratch, num_splits, *, merge_in_kernel, sliding_window=None, scale=0.2):
    out = torch.full_like(batch.q, float("nan"))
    md = batch.metadata
    decode_attention(
        batch.q,
        batch.kv_cache,
        md.block_tables,
        md.seq_lens,
        out,
        scale=scale,
        num_splits=num_splits,
        tiles=TILES,
        sliding_window=sliding_window,
        scratch=scratch,
        merge_in_kernel=merge_in_kernel,
    )
    return out


def both_merges(batch, num_splits, sliding_window=None):
    """The one-launch and the two-launch output; each on its own scratch, as the engine would have."""
    num_seqs, num_heads, head_dim = batch.q.shape
    outputs = []
    for merge_in_kernel in (True, False):
        scratch = SplitScratch.allocate(num_seqs, num_heads, num_splits, head_dim, batch.q.device)
        out = decode(batch, scratch, num_splits, merge_in_kernel=merge_in_kernel, sliding_window=sliding_window)
        outputs.append(out)
        assert not scratch.split_counts.any(), "the one-launch merge leaves every counter at zero"
    return outputs


# Contexts (before the new token) from empty to several tiles: with many splits most of a short
# context's splits are empty, and they still count.
CONTEXTS = [0, 1, 15, 16, 33, 70, 130]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [2, 3, 8])
def test_one_launch_merge_is_bit_identical_to_two_launches(device, dtype, num_splits):
    batch = make_paged_batch(
        CONTEXTS,
        [1] * len(CONTEXTS),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=16,
        dtype=dtype,
        device=device,
        seed=num_splits,
    )
    write_new_tokens(batch)
    one, two = both_merges(batch, num_splits)
    assert one.dtype == dtype
    assert torch.equal(one, two)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert relative_error(one, reference_attention(batch, 0.2)) < tol


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (6, 2), (8, 1), (16, 2)])  # groups 1, 3, 8, 8
def test_one_launch_merge_groups(device, num_heads, num_kv_heads):
    batch = make_paged_batch(
        [5, 40, 100],
        [1] * 3,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=16,
        block_size=16,
        dtype=torch.bfloat16,
        device=device,
        seed=num_heads,
    )
    write_new_tokens(batch)
    one, two = both_merges(batch, 4)
    assert torch.equal(one, two)
    assert relative_error(one, reference_attention(batch, 0.2)) < 1e-2


@pytest.mark.parametrize("sliding_window", [1, 20])
def test_one_launch_merge_sliding_window(device, sliding_window):
    batch = make_paged_batch(
        [0, 6, 50, 90],
        [1] * 4,
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        block_size=16,
        device=device,
        seed=sliding_window,
    )
    write_new_tokens(batch)
    one, two = both_merges(batch, 4, sliding_window)
    assert torch.equal(one, two)
    assert relative_error(one, reference_attention(batch, 0.2, sliding_window)) < 1e-5


def test_one_scratch_serves_launches_of_other_sizes(device):
    """As across layers, steps and captured batch sizes: every launch finds the counters at zero."""
    scratch = SplitScratch.allocate(6, 8, 16, 32, device)
    assert scratch.split_counts.dtype == torch.int32 and not scratch.split_counts.any()
    for seed, (contexts, num_heads, num_kv_heads, num_splits) in enumerate(
        [([3, 64, 20], 8, 2, 16), ([100] * 6, 4, 4, 4), ([0, 31, 32, 47, 1], 8, 1, 3), ([200], 8, 2, 16)]
    ):
        batch = make_paged_batch(
            contexts,
            [1] * len(contexts),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=32,
            block_size=16,
            device=device,
            seed=seed,
        )
        write_new_tokens(batch)
        one = decode(batch, scratch, num_splits, merge_in_kernel=True)
        assert not scratch.split_counts.any()
        two = decode(batch, scratch, num_splits, merge_in_kernel=False)
        assert torch.equal(one, two)


def test_the_counter_decides_which_program_merges(device):
    """A counter one short of the split count makes the first program of that (request, KV head) to
    finish merge at once, over partials the other splits have not written (NaN here): so the merge
    waits on the count, not on a program's split index (on a GPU, splits finish in any order)."""
    batch = make_paged_batch(
        [70, 70], [1, 1], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, device=device, seed=5
    )
    write_new_tokens(batch)
    num_splits = 4
    scratch = SplitScratch.allocate(2, 4, num_splits, 32, device)
    scratch.part_out.fill_(float("nan"))
    scratch.part_lse.fill_(float("nan"))
    scratch.split_counts[1, 0] = num_splits - 1  # request 1, KV head 0 (query heads 0 and 1)
    out = decode(batch, scratch, num_splits, merge_in_kernel=True)
    expected = reference_attention(batch, 0.2)
    assert torch.isnan(out[1, :2]).all()
    assert relative_error(out[0], expected[0]) < 1e-5
    assert relative_error(out[1, 2:], expected[1, 2:]) < 1e-5
