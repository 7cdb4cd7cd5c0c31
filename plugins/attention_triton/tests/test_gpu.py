"""On a CUDA device: the kernels at real shapes in bfloat16/float16, and CUDA-graph capture of decode (the engine
on a GPU: ``test_engine_gpu.py``).

Run with ``python -m pytest -q -m gpu plugins/attention_triton/tests``.
"""

from __future__ import annotations

import pytest
import torch
from infer_core.interfaces import AttentionLayer

from infer_attention_triton.backend import TritonAttentionBackend
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.prefill import prefill_attention
from infer_attention_triton.testing import make_paged_batch, reference_attention, relative_error, write_new_tokens
from infer_attention_triton.tiles import decode_tiles, prefill_tiles

pytestmark = pytest.mark.gpu

DEVICE = "cuda"


def check_decode(batch, scale, num_splits, window=None, tol=1e-2):
    num_seqs, num_heads, head_dim = batch.q.shape
    out = torch.full_like(batch.q, float("nan"))
    scratch = SplitScratch.allocate(num_seqs, num_heads, num_splits, head_dim, DEVICE)
    md = batch.metadata
    decode_attention(
        batch.q,
        batch.kv_cache,
        md.block_tables,
        md.seq_lens,
        out,
        scale=scale,
        num_splits=num_splits,
        tiles=decode_tiles(head_dim),
        sliding_window=window,
        scratch=scratch,
    )
    err = relative_error(out, reference_attention(batch, scale, window, dtype=torch.float32))
    assert err < tol, f"decode relative error {err:.2e}"


@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("num_splits", [1, 4, 64])
def test_decode_bf16_real_shapes(block_size, num_splits):
    contexts = [0, 1, block_size - 1, block_size, block_size + 1, 1000, 4095, 8191, 12000]
    batch = make_paged_batch(
        contexts,
        [1] * len(contexts),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=block_size,
        dtype=torch.bfloat16,
        device=DEVICE,
        seed=block_size + num_splits,
    )
    write_new_tokens(batch)
    check_decode(batch, 128**-0.5, num_splits)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "dtype"),
    [
        (16, 16, 64, torch.bfloat16),
        (16, 2, 256, torch.bfloat16),
        (64, 8, 128, torch.float16),
        (8, 8, 128, torch.float16),
    ],
)
def test_decode_other_shapes(num_heads, num_kv_heads, head_dim, dtype):
    contexts = [5, 300, 2047, 5000]
    batch = make_paged_batch(
        contexts,
        [1] * 4,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=16,
        dtype=dtype,
        device=DEVICE,
        seed=head_dim,
    )
    write_new_tokens(batch)
    check_decode(batch, head_dim**-0.5, 8)
    check_decode(batch, head_dim**-0.5, 4, window=700)


def test_decode_long_context_128k():
    batch = make_paged_batch(
        [131071],
        [1],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=256,
        dtype=torch.bfloat16,
        device=DEVICE,
        spare_blocks=0,
    )
    write_new_tokens(batch)
    check_decode(batch, 128**-0.5, 64)


@pytest.mark.parametrize(
    ("head_dim", "block_size", "dtype"),
    [(128, 16, torch.bfloat16), (128, 256, torch.bfloat16), (64, 32, torch.float16), (256, 16, torch.bfloat16)],
)
def test_prefill_real_shapes(head_dim, block_size, dtype):
    # Whole prompts, prefix-cache hits (a whole number of blocks cached) and chunks starting mid-block.
    contexts = [0, 0, 2 * block_size, 1024, 700, 33]
    queries = [2048, 17, 500, 1024, 129, 2]
    batch = make_paged_batch(
        contexts,
        queries,
        num_heads=32,
        num_kv_heads=8,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=DEVICE,
        seed=head_dim + block_size,
    )
    write_new_tokens(batch)
    md = batch.metadata
    scale = head_dim**-0.5
    for window in (None, 300):
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
            tiles=prefill_tiles(head_dim, block_size),
            sliding_window=window,
        )
        err = relative_error(out, reference_attention(batch, scale, window, dtype=torch.float32))
        assert err < 1e-2, f"prefill (window {window}) relative error {err:.2e}"


def _backend(num_heads=32, num_kv_heads=8, head_dim=128):
    from infer_core.interfaces import RuntimeContext
    from infer_core.models.config import model_config_from_dict
    from infer_core.settings import EngineSettings

    model = model_config_from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 4096,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
        }
    )
    ctx = RuntimeContext("cuda", "bfloat16", model, EngineSettings(), torch.cuda.get_device_capability(), 1, False)
    return TritonAttentionBackend(ctx)


def test_mixed_step_bf16():
    contexts = [100, 3000, 256, 0, 512, 77]
    queries = [1, 1, 1, 900, 256, 300]
    batch = make_paged_batch(
        contexts,
        queries,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device=DEVICE,
        seed=9,
    )
    backend = _backend()
    out = backend.forward(
        AttentionLayer(0, 32, 8, 128, 128**-0.5),
        batch.q,
        batch.k,
        batch.v,
        batch.kv_cache,
        backend.build_metadata(batch.metadata),
    )
    err = relative_error(out, reference_attention(batch, 128**-0.5, dtype=torch.float32))
    assert err < 1e-2


def test_decode_step_replays_in_a_cuda_graph():
    """Captured once for 8 requests; replayed with other lengths, pages and queries written in place."""
    backend = _backend()
    layer = AttentionLayer(0, 32, 8, 128, 128**-0.5)
    first = make_paged_batch(
        [8000] * 8,
        [1] * 8,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device=DEVICE,
        seed=1,
        spare_blocks=64,
    )
    md = first.metadata
    md.max_seq_len = 8192  # capture for the longest context the graph will serve
    metadata = backend.build_metadata(md)
    q, k, v, cache = first.q.clone(), first.k.clone(), first.v.clone(), first.kv_cache
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(layer, q, k, v, cache, metadata)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(layer, q, k, v, cache, metadata)

    for seed, contexts in ((2, [0, 15, 16, 17, 255, 1000, 4000, 7000]), (3, [3000] * 8)):
        fresh = make_paged_batch(
            contexts,
            [1] * 8,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            block_size=16,
            dtype=torch.bfloat16,
            device=DEVICE,
            seed=seed,
        )
        assert fresh.kv_cache.shape[1] <= cache.shape[1]
        cache.zero_()
        cache[:, : fresh.kv_cache.shape[1]].copy_(fresh.kv_cache)
        for name in ("seq_lens", "slot_mapping"):
            getattr(md, name).copy_(getattr(fresh.metadata, name))
        md.block_tables.zero_()
        md.block_tables[:, : fresh.metadata.block_tables.shape[1]].copy_(fresh.metadata.block_tables)
        for buffer, value in ((q, fresh.q), (k, fresh.k), (v, fresh.v)):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        fresh.kv_cache = cache
        fresh.metadata.block_tables = md.block_tables
        err = relative_error(out[:8], reference_attention(fresh, 128**-0.5, dtype=torch.float32))
        assert err < 1e-2, f"replay with contexts {contexts}: relative error {err:.2e}"
