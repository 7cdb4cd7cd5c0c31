"""The split-K GEMM on CUDA at the real projection shapes: against F.linear in float64, the same bits on
every call and in CUDA-graph replay (the last-program merge races for real here), PDL on and off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer_core.layers import fused
from infer_core.layers.fused.gemm_splitk import GemmConfig, device_scratch, gemm_splitk

pytestmark = pytest.mark.gpu

# (N, K): Qwen3-0.6B's qkv, o, gate_up, down; Qwen3-8B's; both LM heads
SHAPES = {
    "qwen3-0.6b": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)],
    "qwen3-8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
    "lm-head": [(151936, 1024), (151936, 4096)],
}
ROWS = [3, 4, 8, 16, 32, 64, 128, 192, 256]
# tiles of the benchmark's sweep: both orientations, 64/128 W rows, deep and shallow K steps, many splits
OTHER_CONFIGS = [GemmConfig(16, 128, 256, 4, True, 4, 3), GemmConfig(32, 64, 128, 16, True, 4, 4),
                 GemmConfig(64, 128, 128, 2, True, 4, 3), GemmConfig(64, 64, 128, 6, False, 4, 4),
                 GemmConfig(128, 128, 64, 3, False, 8, 4), GemmConfig(128, 128, 128, 12, False, 8, 3),
                 GemmConfig(128, 64, 64, 1, False, 4, 3)]


def weights(n: int, k: int, dtype=torch.bfloat16, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    return w, b


def rows(num_rows: int, k: int, dtype=torch.bfloat16, seed: int = 1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(num_rows, k, device="cuda", generator=gen).to(dtype)


def reference(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double()).to(x.dtype)


@pytest.mark.parametrize("group", sorted(SHAPES))
def test_real_shapes_every_row_count(group, assert_close_to_reference):
    """Within one bf16 step of the float64 result; the same bits twice (splits race to the merge)."""
    for n, k in SHAPES[group]:
        w, b = weights(n, k)
        for num_rows in ROWS:
            x = rows(num_rows, k, seed=num_rows)
            bias = b if num_rows % 2 else None
            y = gemm_splitk(x, w, bias)
            assert_close_to_reference(y, reference(x, w, bias), ulps=1)
            assert torch.equal(y, gemm_splitk(x, w, bias)), (n, k, num_rows)


@pytest.mark.parametrize("config", OTHER_CONFIGS, ids=str)
def test_sweep_tiles(config, assert_close_to_reference):
    """Other tiles the benchmark sweeps, bf16 and fp16, at K with and without a tail, M not a tile multiple."""
    for dtype in (torch.bfloat16, torch.float16):
        for n, k in ((4096, 1024), (1024, 3072), (1000, 1000)):
            w, b = weights(n, k, dtype)
            for num_rows in (5, 61, 200):
                x = rows(num_rows, k, dtype, seed=num_rows)
                assert_close_to_reference(gemm_splitk(x, w, b, config=config), reference(x, w, b), ulps=1)


@pytest.mark.parametrize("num_rows", [4, 16, 256])
def test_many_calls_give_the_same_bits(num_rows):
    """Whichever split arrives last, the sum runs in split order: 50 calls, one result, counters back at zero."""
    n, k = 1024, 3072  # down: the longest K of Qwen3-0.6B
    w, b = weights(n, k)
    x = rows(num_rows, k)
    swap = num_rows <= 64
    for config in (None, GemmConfig(16 if swap else 128, 64, 128, 8, swap, 4, 3)):  # the chosen tiles, 8 splits
        first = gemm_splitk(x, w, b, config=config)
        for _ in range(50):
            assert torch.equal(gemm_splitk(x, w, b, config=config), first)
        torch.cuda.synchronize()
        assert not device_scratch(x.device, 1, 1).tile_counts.any()


@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("num_rows", [3, 16, 64, 256])
def test_graph_replay_equals_eager_bit_for_bit(num_rows, pdl, monkeypatch):
    monkeypatch.setattr(fused, "PDL", pdl)
    layers = [weights(n, k, seed=i) for i, (n, k) in enumerate(SHAPES["qwen3-0.6b"] + SHAPES["qwen3-8b"][:2])]
    widths = {w.shape[1] for w, _ in layers}
    static_x = {k: torch.zeros(num_rows, k, dtype=torch.bfloat16, device="cuda") for k in widths}

    def forward():
        return [gemm_splitk(static_x[w.shape[1]], w, b) for w, b in layers]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # compiled, and the scratch allocated, before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = forward()
    torch.cuda.current_stream().wait_stream(stream)
    for seed in range(3):
        for k, buf in static_x.items():
            buf.copy_(rows(num_rows, k, seed=seed + k))
        for _ in range(3):
            graph.replay()
            eager = forward()
            for got, want in zip(static_out, eager):
                assert torch.equal(got, want)


def test_scratch_growth_inside_a_capture_is_refused():
    """A shape needing more scratch than any call before the capture: an error naming the warm-up."""
    w, _ = weights(151936, 1024)
    x = rows(256, 1024)
    huge = GemmConfig(128, 64, 64, 16, False, 4, 3)  # 2 x 2374 tiles x 16 splits: more than anything before
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="warm-up"):
        with torch.cuda.graph(graph):
            gemm_splitk(x, w, config=huge)
