"""On a CUDA device: split-K decode merged in the same launch against the two-launch merge, bit for
bit, over many CUDA-graph replays with random lengths, at batch 1..64 and the split counts the
backend picks for them, and against the float32 torch reference.

Each graph holds several decode launches in a row that share one scratch, as the layers of a step
do, so every launch depends on the one before it leaving the split counters at zero (with PDL on
sm90+, the launches overlap as in the engine). Races between the split programs of a (request, KV
head), or partials read before they are visible, would show as mismatches or NaN.

Run with ``python -m pytest -q -m gpu plugins/attention_triton/tests/test_decode_merge_gpu.py``.
"""

from __future__ import annotations

import random

import pytest
import torch

from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.testing import make_paged_batch, reference_attention, relative_error
from infer_attention_triton.tiles import choose_num_splits, decode_tiles

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
HEAD_DIM = 128
NUM_LAYERS = 6  # decode launches per graph, sharing one scratch
MAX_CONTEXT = 3000  # tokens each request can see; the lengths of a replay are drawn below it


class DecodeGraphs:
    """One paged cache and two captured graphs over the same inputs: one-launch and two-launch merge."""

    def __init__(self, num_seqs: int, num_heads: int, num_kv_heads: int, max_model_len: int, seed: int) -> None:
        self.batch = make_paged_batch(
            [MAX_CONTEXT - 1] * num_seqs,
            [1] * num_seqs,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=HEAD_DIM,
            block_size=16,
            dtype=torch.bfloat16,
            device=DEVICE,
            seed=seed,
        )
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.tiles = decode_tiles(HEAD_DIM)
        # As the backend captures a batch size: the split count for the longest context the graph serves.
        self.num_splits = choose_num_splits(num_seqs, num_kv_heads, max_model_len, num_sms, self.tiles.block_n)
        self.q = torch.empty(NUM_LAYERS, num_seqs, num_heads, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
        self.seq_lens = self.batch.metadata.seq_lens  # written in place before each replay
        self.scratch = {
            m: SplitScratch.allocate(num_seqs, num_heads, self.num_splits, HEAD_DIM, DEVICE) for m in (True, False)
        }
        self.out = {m: torch.empty_like(self.q) for m in (True, False)}
        self.graphs = {m: self._capture(m) for m in (True, False)}

    def _layers(self, merge_in_kernel: bool) -> None:
        md = self.batch.metadata
        for layer in range(NUM_LAYERS):
            decode_attention(
                self.q[layer],
                self.batch.kv_cache,
                md.block_tables,
                self.seq_lens,
                self.out[merge_in_kernel][layer],
                scale=HEAD_DIM**-0.5,
                num_splits=self.num_splits,
                tiles=self.tiles,
                scratch=self.scratch[merge_in_kernel],
                merge_in_kernel=merge_in_kernel,
            )

    def _capture(self, merge_in_kernel: bool) -> torch.cuda.CUDAGraph:
        self.q.normal_()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._layers(merge_in_kernel)  # compiled before the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._layers(merge_in_kernel)
        return graph

    def replay(self, seq_lens: list[int], seed: int) -> None:
        self.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))
        self.q.normal_(generator=torch.Generator(device=DEVICE).manual_seed(seed))
        for m in (True, False):
            self.out[m].fill_(float("nan"))
            self.graphs[m].replay()
        torch.cuda.synchronize()

    def reference(self, layer: int, seq_lens: list[int]) -> torch.Tensor:
        self.batch.q = self.q[layer]
        self.batch.context_lens = [n - 1 for n in seq_lens]
        return reference_attention(self.batch, HEAD_DIM**-0.5, dtype=torch.float32)


def random_lengths(rng: random.Random, num_seqs: int) -> list[int]:
    """Mostly any length; some very short (most splits empty) and some at the longest."""
    kinds = (lambda: rng.randint(1, MAX_CONTEXT), lambda: rng.randint(1, 40), lambda: MAX_CONTEXT)
    return [rng.choices(kinds, weights=(6, 2, 1))[0]() for _ in range(num_seqs)]


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(16, 8), (32, 8)])  # Qwen3-0.6B, Qwen3-8B
@pytest.mark.parametrize("max_model_len", [8192, 40960])
@pytest.mark.parametrize("num_seqs", [1, 2, 3, 8, 17, 32])  # 64 requests x 8 KV heads fill an H100: one split
def test_one_launch_merge_matches_two_launches_over_replays(num_seqs, num_heads, num_kv_heads, max_model_len):
    graphs = DecodeGraphs(num_seqs, num_heads, num_kv_heads, max_model_len, seed=num_seqs)
    if graphs.num_splits == 1:
        pytest.skip(f"batch {num_seqs} is not split at {max_model_len} tokens: no merge")
    rng = random.Random(num_seqs * 1000 + num_heads)
    for replay in range(40):
        seq_lens = random_lengths(rng, num_seqs)
        graphs.replay(seq_lens, seed=replay)
        one, two = graphs.out[True], graphs.out[False]
        assert not torch.isnan(one).any(), f"replay {replay}, lengths {seq_lens}: rows left unwritten (NaN)"
        assert torch.equal(one, two), (
            f"replay {replay}, {graphs.num_splits} splits, lengths {seq_lens}: one-launch and two-launch merge differ "
            f"in {(one != two).sum().item()} of {one.numel()} values"
        )
        if replay % 10 == 0:
            for layer in (0, NUM_LAYERS - 1):
                err = relative_error(one[layer], graphs.reference(layer, seq_lens))
                assert err < 1e-2, f"replay {replay}, layer {layer}: relative error {err:.2e}"
    assert not graphs.scratch[True].split_counts.any(), "the one-launch merge leaves every counter at zero"


def test_one_launch_merge_many_replays_at_batch_one():
    """The batch-1 decode of the latency benchmark: 64 splits of mostly empty slices, replayed often."""
    graphs = DecodeGraphs(1, 16, 8, 40960, seed=7)
    assert graphs.num_splits > 1
    rng = random.Random(7)
    for replay in range(300):
        seq_lens = [rng.randint(1, 400) if replay % 3 else rng.randint(1, MAX_CONTEXT)]
        graphs.replay(seq_lens, seed=replay)
        assert torch.equal(graphs.out[True], graphs.out[False]), f"replay {replay}, length {seq_lens[0]}"
    assert not graphs.scratch[True].split_counts.any()


def test_eager_launches_share_one_scratch_with_the_graphs():
    """Eager launches of other batch sizes on the scratch a graph uses leave it ready for the graph."""
    graphs = DecodeGraphs(8, 16, 8, 8192, seed=3)
    scratch = graphs.scratch[True]
    for num_seqs in (1, 5, 8):
        small = make_paged_batch(
            [500] * num_seqs, [1] * num_seqs, num_heads=16, num_kv_heads=8, head_dim=HEAD_DIM, block_size=16,
            dtype=torch.bfloat16, device=DEVICE, seed=num_seqs,
        )  # fmt: skip
        out = torch.empty_like(small.q)
        md = small.metadata
        decode_attention(
            small.q, small.kv_cache, md.block_tables, md.seq_lens, out, scale=HEAD_DIM**-0.5,
            num_splits=min(graphs.num_splits, 4), tiles=graphs.tiles, scratch=scratch,
        )  # fmt: skip
        assert relative_error(out, reference_attention(small, HEAD_DIM**-0.5, dtype=torch.float32)) < 1e-2
    seq_lens = [100, 2999, 1, 3000, 17, 640, 1200, 64]
    graphs.replay(seq_lens, seed=0)
    assert torch.equal(graphs.out[True], graphs.out[False])
    assert not scratch.split_counts.any()
