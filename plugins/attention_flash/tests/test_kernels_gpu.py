"""flash against the ``torch`` backend on fresh random inputs, on a CUDA device with flash_attn.

Each case is a paged batch (blocks scattered at random over the pool, decode-only requests first,
as the runner orders them): ragged decodes, fresh prompts, prefix-cache hits, prefill chunks that
start or end inside a block, mixed steps, padding rows, sliding windows, and a decode step
captured in a CUDA graph and replayed on new inputs. The reference runs in float32 on the same
half-precision values; flash must agree within 1e-2 relative error per request and write
exactly the same K/V into the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from infer_core.builtin.attention_torch import TorchAttentionBackend
from infer_core.interfaces import AttentionLayer, BatchMetadata, RuntimeContext
from infer_core.models.config import model_config_from_dict
from infer_core.settings import EngineSettings

pytestmark = pytest.mark.gpu

BLOCK_SIZE = 256
DEVICE = "cuda"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# (context tokens already cached, query tokens this step) per request, decode-only requests first.
CASES = {
    "decode_ragged": [(0, 1), (16, 1), (254, 1), (255, 1), (256, 1), (1000, 1), (3071, 1)],
    "prefill_ragged": [(0, 2), (0, 77), (0, 256), (0, 257), (0, 1500)],
    "prefix_hits": [(256, 3), (512, 300), (768, 513)],
    "chunk_boundaries": [(511, 1), (100, 156), (255, 2), (257, 255), (512, 256)],
    "mixed": [(40, 1), (700, 1), (0, 300), (256, 64), (1000, 17)],
}
HEADS = [(16, 8, 128), (32, 8, 64), (8, 8, 256), (12, 4, 96)]


def make_context(dtype: str, num_heads: int, num_kv_heads: int, head_dim: int) -> RuntimeContext:
    model = model_config_from_dict(
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": 128,
            "hidden_size": num_heads * head_dim,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim,
        }
    )
    return RuntimeContext(DEVICE, dtype, model, EngineSettings(), torch.cuda.get_device_capability(), 1)


def backends(ctx: RuntimeContext):
    from infer_attention_flash.backend import FlashAttentionBackend

    return FlashAttentionBackend(ctx), TorchAttentionBackend(ctx)


@dataclass
class PagedBatch:
    metadata: BatchMetadata
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor
    query_lens: list[int]


def make_batch(requests, num_heads, num_kv_heads, head_dim, dtype, seed, num_padding=0) -> PagedBatch:
    """Random K/V everywhere in the pool (the cached context), random q/k/v for the new tokens."""
    g = torch.Generator().manual_seed(seed)
    context_lens = [c for c, _ in requests]
    query_lens = [n for _, n in requests]
    num_decodes = sum(1 for n in query_lens if n == 1)
    assert all(n == 1 for n in query_lens[:num_decodes]), "decode-only requests come first"
    seq_lens = [c + n for c, n in requests]
    blocks_per_req = [-(-s // BLOCK_SIZE) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    pool = torch.randperm(num_blocks, generator=g).tolist()
    block_tables = torch.zeros(len(requests), max(blocks_per_req), dtype=torch.int32)
    slots = []
    for i, (count, ctx_len, seq_len) in enumerate(zip(blocks_per_req, context_lens, seq_lens)):
        block_tables[i, :count] = torch.tensor([pool.pop() for _ in range(count)], dtype=torch.int32)
        slots += [int(block_tables[i, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in range(ctx_len, seq_len)]
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    num_tokens = int(query_start_loc[-1])
    rows = num_tokens + num_padding
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    metadata = BatchMetadata(
        num_reqs=len(requests),
        num_tokens=num_tokens,
        num_decode_only=num_decodes,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=BLOCK_SIZE,
        query_start_loc=query_start_loc.to(DEVICE),
        seq_lens=seq_lens_t.to(DEVICE),
        block_tables=block_tables.to(DEVICE),
        slot_mapping=torch.tensor(slots + [-1] * num_padding, dtype=torch.int32).to(DEVICE),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
    )

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(DTYPES[dtype]).to(DEVICE)

    kv_cache = randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    return PagedBatch(
        metadata,
        randn(rows, num_heads, head_dim),
        randn(rows, num_kv_heads, head_dim),
        randn(rows, num_kv_heads, head_dim),
        kv_cache,
        query_lens,
    )


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm().clamp_min(1e-12))


def check_against_torch(batch: PagedBatch, dtype, heads, window=None):
    num_heads, num_kv_heads, head_dim = heads
    flash, reference = backends(make_context(dtype, *heads))
    layer = AttentionLayer(0, num_heads, num_kv_heads, head_dim, head_dim**-0.5, window)
    ref_cache = batch.kv_cache.float()
    expected = reference.forward(layer, batch.q.float(), batch.k.float(), batch.v.float(), ref_cache, batch.metadata)
    cache = batch.kv_cache.clone()
    got = flash.forward(layer, batch.q, batch.k, batch.v, cache, flash.build_metadata(batch.metadata))
    torch.cuda.synchronize()
    assert got.shape == batch.q.shape and got.dtype == batch.q.dtype
    assert torch.equal(cache.float(), ref_cache), "the KV written into the cache differs"
    starts = batch.metadata.query_start_loc_cpu.tolist()
    for i, n in enumerate(batch.query_lens):
        start, end = starts[i], starts[i + 1]
        err = relative_error(got[start:end], expected[start:end])
        assert err < 1e-2, f"request {i} ({n} query tokens): relative error {err:.2e}"
    n = batch.metadata.num_tokens
    assert not got[n:].any(), "padding rows must come back zero"


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "x".join(map(str, h)))
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_bfloat16(case, heads):
    check_against_torch(make_batch(CASES[case], *heads, "bfloat16", seed=sorted(CASES).index(case)), "bfloat16", heads)


@pytest.mark.parametrize("case", ["mixed", "prefix_hits"])
def test_matches_torch_float16(case):
    heads = (16, 8, 128)
    check_against_torch(make_batch(CASES[case], *heads, "float16", seed=7), "float16", heads)


@pytest.mark.parametrize("window", [1, 64, 300, 4096])
@pytest.mark.parametrize("case", ["mixed", "chunk_boundaries", "decode_ragged"])
def test_sliding_window_matches_torch(case, window):
    heads = (16, 8, 128)
    check_against_torch(make_batch(CASES[case], *heads, "bfloat16", seed=window), "bfloat16", heads, window)


def test_padding_rows_are_not_written_and_come_back_zero():
    heads = (16, 8, 128)
    check_against_torch(make_batch(CASES["mixed"], *heads, "bfloat16", seed=3, num_padding=5), "bfloat16", heads)


def test_decode_step_under_cuda_graph_capture():
    """Capture one decode step, then replay it on new lengths, block tables, slots and q/k/v."""
    heads = num_heads, num_kv_heads, head_dim = (16, 8, 128)
    flash, reference = backends(make_context("bfloat16", *heads))
    layer = AttentionLayer(0, num_heads, num_kv_heads, head_dim, head_dim**-0.5)
    num_reqs, max_context = 8, 2000

    def decode_batch(seed):
        g = torch.Generator().manual_seed(seed)
        contexts = torch.randint(0, max_context, (num_reqs,), generator=g).tolist()
        return make_batch([(c, 1) for c in contexts], *heads, "bfloat16", seed=seed)

    first = decode_batch(0)
    static = first.metadata  # the graph reads these device tensors; later steps copy into them
    width = -(-(max_context + 1) // BLOCK_SIZE)
    static.block_tables = torch.zeros(num_reqs, width, dtype=torch.int32, device="cuda")
    static.block_tables[:, : first.metadata.block_tables.shape[1]] = first.metadata.block_tables
    pool_blocks = num_reqs * width + 3
    cache = torch.zeros(2, pool_blocks, BLOCK_SIZE, num_kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    q, k, v = first.q.clone(), first.k.clone(), first.v.clone()
    flash_md = flash.build_metadata(static)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up compiles kernels outside the capture
        flash.forward(layer, q, k, v, cache, flash_md)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash.forward(layer, q, k, v, cache, flash_md)

    for seed in (1, 2, 3):
        step = decode_batch(seed)
        assert step.kv_cache.shape[1] <= pool_blocks
        cache[:, : step.kv_cache.shape[1]].copy_(step.kv_cache)
        static.seq_lens.copy_(step.metadata.seq_lens)
        static.block_tables.zero_()
        static.block_tables[:, : step.metadata.block_tables.shape[1]] = step.metadata.block_tables
        static.slot_mapping.copy_(step.metadata.slot_mapping)
        q.copy_(step.q), k.copy_(step.k), v.copy_(step.v)
        ref_cache = cache.float()
        expected = reference.forward(layer, q.float(), k.float(), v.float(), ref_cache, step.metadata)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(cache.float(), ref_cache), f"replay {seed}: KV written differently"
        err = relative_error(out, expected)
        assert err < 1e-2, f"replay {seed}: relative error {err:.2e}"
