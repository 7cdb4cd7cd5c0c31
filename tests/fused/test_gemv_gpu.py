"""The GEMV kernel on CUDA at the real projection shapes: against F.linear in float64, graph replay
equal to eager bit for bit, the L2 prefetch before the PDL wait changing no bit, and the dispatch of the
linear layers and the LM head to it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from infer_core.interfaces import ParallelContext
from infer_core.layers import fused
from infer_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.dense import GEMV_MAX_ROWS, use_gemv
from infer_core.layers.fused.gemv import MAX_ROWS, GemvConfig, choose_config, gemv, num_sms
from infer_core.layers.unquantized import UnquantizedLinearMethod

pytestmark = pytest.mark.gpu

# (N, K): qkv, o, gate_up, down, LM head
SHAPES = {
    "qwen3-0.6b": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151936, 1024)],
    "qwen3-8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
    "llama-3.1-8b": [(28672, 4096), (4096, 14336), (128256, 4096)],
}
ROWS = [1, 2, 3, 4, 5, 8]
# besides the heuristic's tiles: one K step of 1024 a loop iteration unpipelined, and 512 in 3 stages
OTHER_CONFIGS = {"fma-8x1024-s1": GemvConfig(8, 1024, num_warps=4, num_stages=1),
                 "fma-16x512-s3": GemvConfig(16, 512, num_warps=4, num_stages=3)}


def weights(n: int, k: int, dtype=torch.bfloat16, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    return w, b


def rows(num_rows: int, k: int, dtype=torch.bfloat16, seed: int = 1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(num_rows, k, device="cuda", generator=gen).to(dtype)


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_real_shapes_match_f_linear(model, assert_close_to_reference):
    for n, k in SHAPES[model]:
        w, b = weights(n, k)
        w64 = w.double()
        for num_rows in ROWS:
            x = rows(num_rows, k, seed=num_rows)
            for bias in (None, b):
                expected = F.linear(x.double(), w64, None if bias is None else bias.double())
                # one rounding of the exact sum: within a step (cuBLAS's bf16 F.linear may reduce split-K
                # partials in bf16, allow_bf16_reduced_precision_reduction, so it is not the reference)
                assert_close_to_reference(gemv(x, w, bias), expected.to(torch.bfloat16), ulps=1)
        del w64


@pytest.mark.parametrize("config", ["heuristic", *OTHER_CONFIGS])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 3072), (1000, 1000), (777, 4095)])
def test_tiles_and_unaligned_shapes(config, n, k, assert_close_to_reference):
    """Every row count, bf16 and fp16, also where K rows are not 16-byte aligned (no vector loads)."""
    for dtype in (torch.bfloat16, torch.float16):
        w, b = weights(n, k, dtype)
        for num_rows in range(1, MAX_ROWS + 1):
            x = rows(num_rows, k, dtype, seed=num_rows)
            expected = F.linear(x.double(), w.double(), b.double()).to(dtype)
            assert_close_to_reference(gemv(x, w, b, config=OTHER_CONFIGS.get(config)), expected, ulps=1)


@pytest.mark.parametrize("num_rows", [1, 2, 4, 8])
def test_graph_replay_equals_eager_bit_for_bit(num_rows):
    layers = [weights(n, k, seed=i) for i, (n, k) in enumerate(SHAPES["qwen3-0.6b"] + SHAPES["qwen3-8b"][:1])]
    static_x = {k: torch.zeros(num_rows, k, dtype=torch.bfloat16, device="cuda") for _, k in
                (w.shape for w, _ in layers)}

    def forward():
        return [gemv(static_x[w.shape[1]], w, b) for w, b in layers]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # compiled before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = forward()
    torch.cuda.current_stream().wait_stream(stream)
    for seed in range(3):
        for k, buf in static_x.items():
            buf.copy_(rows(num_rows, k, seed=seed + k))
        graph.replay()
        eager = forward()
        again = forward()
        for got, want, want_again in zip(static_out, eager, again):
            assert torch.equal(got, want) and torch.equal(want, want_again)


# several K steps a program: Qwen3-8B's and Llama-3.1-8B's projections and LM heads (1 stage), Qwen3-0.6B's down (3)
SEVERAL_STEPS = SHAPES["qwen3-8b"] + SHAPES["llama-3.1-8b"] + [(151936, 4096), (1024, 3072)]


def capture(forward):
    """A CUDA graph of ``forward`` (compiled first) and its static outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = forward()
    torch.cuda.current_stream().wait_stream(stream)
    return graph, static_out


@pytest.mark.parametrize("num_rows", [1, 2, 8])
def test_l2_prefetch_changes_no_bit(num_rows):
    """Programs of several K steps ask L2 for their first steps' W before the PDL wait (gemv.prefetch_w_to_l2).
    Nothing it does reaches the sums: the same bits as prefetch_steps=0 (the kernel as it was before the
    prefetch), eagerly and replayed back to back from a graph, where each call may start during the one before."""
    if not use_pdl(rows(1, 8)):
        pytest.skip("the prefetch is issued only with PDL (sm_90 or newer, fused.PDL on)")
    layers = []
    for n, k in SEVERAL_STEPS:
        w, b = weights(n, k, seed=n + k)
        cfg = choose_config(n, k, 2, num_sms(w.device))
        assert cfg.block_k < k, (n, k, cfg)  # several K steps: a prefetch has something to ask for
        layers.append((w, b, cfg))
    xs = {k: rows(num_rows, k, seed=k) for k in {w.shape[1] for w, _, _ in layers}}
    without = [gemv(xs[w.shape[1]], w, b, config=replace(cfg, prefetch_steps=0)) for w, b, cfg in layers]
    for steps in (1, 2, 6):
        for (w, b, cfg), want in zip(layers, without):
            assert torch.equal(gemv(xs[w.shape[1]], w, b, config=replace(cfg, prefetch_steps=steps)), want)
    graph, static_out = capture(lambda: [gemv(xs[w.shape[1]], w, b, config=replace(cfg, prefetch_steps=1))
                                         for w, b, cfg in layers])
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(got, want) for got, want in zip(static_out, without))


def dense_method(n: int, k: int, w: torch.Tensor) -> tuple[nn.Module, UnquantizedLinearMethod]:
    """A layer's dense method built on the GPU (where it picks the GEMV), holding ``w``."""
    layer, method = nn.Module(), UnquantizedLinearMethod()
    with torch.device("cuda"):
        method.create_weights(layer, k, [n], torch.bfloat16)
    layer.weight.data = w
    return layer, method


def test_linear_method_dispatch(monkeypatch):
    """GEMV up to GEMV_MAX_ROWS flattened rows (where it measured faster), F.linear beyond and when built without."""
    n, k = 6144, 1024
    w, b = weights(n, k)
    layer, method = dense_method(n, k, w)
    assert method.gemv  # the default, built on CUDA
    for num_rows in range(1, GEMV_MAX_ROWS + 1):
        x = rows(num_rows, k, seed=num_rows)
        assert use_gemv(x, layer.weight)
        assert torch.equal(method.apply(layer, x, b), gemv(x, w, b))
        assert torch.equal(method.apply(layer, x[None], b), gemv(x[None], w, b))  # leading dims are rows too
    x = rows(GEMV_MAX_ROWS + 1, k)
    for beyond in (x, x.reshape(1, *x.shape), rows(GEMV_MAX_ROWS, k).expand(2, -1, -1)):  # rows over leading dims
        assert not use_gemv(beyond, layer.weight)
        assert torch.equal(method.apply(layer, beyond, b), F.linear(beyond, w, b))
    assert not use_gemv(rows(1, k).float(), layer.weight)  # a dtype the kernel is not used for
    monkeypatch.setattr(fused, "GEMV", fused.FusedImpl.TORCH)  # read when the method is built
    layer, method = dense_method(n, k, w)
    assert not method.gemv
    x = rows(1, k)
    assert torch.equal(method.apply(layer, x, b), F.linear(x, w, b))


@pytest.mark.parametrize("tied", [False, True])
def test_lm_head_dispatch(tied):
    """The LM head (Qwen3-0.6B's vocabulary) runs the GEMV at decode sizes, tied to the embedding or not."""
    vocab, hidden_size = 151936, 1024
    parallel = ParallelContext.single()
    with torch.device("cuda"):  # built where it runs: the GEMV is chosen then
        embed = VocabParallelEmbedding(vocab, hidden_size, parallel=parallel, dtype=torch.bfloat16)
        head = ParallelLMHead(vocab, hidden_size, parallel=parallel, dtype=torch.bfloat16,
                              tied_to=embed if tied else None)
    assert head.gemv
    w, _ = weights(vocab, hidden_size)
    head.weight.data.copy_(w)
    assert (head.weight is embed.weight) == tied
    for num_rows in range(1, GEMV_MAX_ROWS + 1):
        x = rows(num_rows, hidden_size, seed=num_rows)
        assert torch.equal(head(x), gemv(x, w))
    x = rows(GEMV_MAX_ROWS + 1, hidden_size)
    assert torch.equal(head(x), F.linear(x, w))
