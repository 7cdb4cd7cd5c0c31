"""k/v stored by the core's q/k-norm + rotary kernel instead of this backend's ``write_kv`` launch.

Today's path per layer is ``qk_norm_rope_inplace`` on q and k, then ``forward``, which runs
``write_kv`` and attends. The fused path passes the cache, v and ``standard_kv_slot_mapping`` to the
kernel and calls ``forward(..., kv_written=True)``. Both must leave q, k, v and the cache equal
(``torch.equal``) and give the same attention output. The interpreter runs small shapes on the
CPU; the tests marked ``gpu`` run Qwen3-0.6B and Qwen3-8B shapes and a CUDA-graph replay
(``python -m pytest -q -m gpu plugins/attention_triton/tests/test_kv_fused.py``).
"""

from __future__ import annotations

import pytest
import torch
from infer_core.interfaces import AttentionLayer, RuntimeContext
from infer_core.layers.fused.kv_write import write_kv
from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig, model_config_from_dict
from infer_core.settings import EngineSettings

from infer_attention_triton.backend import TritonAttentionBackend
from infer_attention_triton.testing import make_paged_batch

# Qwen3-0.6B and Qwen3-8B: (query heads, kv heads, head_dim)
REAL_SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}


class QKNormRope:
    """A Qwen3 layer's q-norm and k-norm weights and rotary table, random."""

    def __init__(self, head_dim: int, dtype: torch.dtype, device: str, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.q_weight, self.k_weight = (torch.randn(head_dim, generator=gen).to(dtype).to(device) for _ in range(2))
        self.rotary = RotaryEmbedding(head_dim, RopeConfig(theta=1e6), 40960, 40960).to(device)

    def __call__(self, positions, q, k, **kv) -> None:
        qk_norm_rope_inplace(positions, q, k, self.q_weight, self.k_weight, 1e-6, self.rotary.cos_sin_cache,
                             self.rotary.rot_dim, **kv)


def qkv_buffer(q, k, v, num_padding: int = 0) -> torch.Tensor:
    """The fused qkv projection's output holding q, k, v (plus random padding rows)."""
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    return torch.cat([qkv, torch.randn(num_padding, qkv.shape[1], device=qkv.device).to(qkv.dtype)])


def split(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return (x.view(qkv.shape[0], -1, head_dim) for x in (q, k, v))


def make_backend(device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> TritonAttentionBackend:
    model = model_config_from_dict({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "max_position_embeddings": 40960,
    })
    cuda = device == "cuda"
    ctx = RuntimeContext(device, str(dtype).removeprefix("torch."), model, EngineSettings(),
                         torch.cuda.get_device_capability() if cuda else None, int(cuda), not cuda)
    return TritonAttentionBackend(ctx)


def attention_both_ways(batch, heads, kv_heads, head_dim, device, *, num_padding=2, seed=0):
    """(output, cache, qkv) of today's path and of the fused one, on the same step."""
    dtype = batch.q.dtype
    norm_rope = QKNormRope(head_dim, dtype, device, seed)
    backend = make_backend(device, dtype, heads, kv_heads, head_dim)
    metadata = backend.build_metadata(batch.metadata)
    layer = AttentionLayer(0, heads, kv_heads, head_dim, head_dim**-0.5)
    qkv = qkv_buffer(batch.q, batch.k, batch.v, num_padding)
    positions = torch.randint(0, 40960, (qkv.shape[0],), device=device)

    two_step_qkv, two_step_cache = qkv.clone(), batch.kv_cache.clone()
    q, k, v = split(two_step_qkv, heads, kv_heads, head_dim)
    norm_rope(positions, q, k)
    two_step_out = backend.forward(layer, q, k, v, two_step_cache, metadata)

    fused_qkv, fused_cache = qkv.clone(), batch.kv_cache.clone()
    q, k, v = split(fused_qkv, heads, kv_heads, head_dim)
    slot_mapping = backend.standard_kv_slot_mapping(metadata)
    assert slot_mapping.shape == (batch.metadata.num_tokens,)
    norm_rope(positions, q, k, kv_cache=fused_cache, v=v, slot_mapping=slot_mapping)
    fused_out = backend.forward(layer, q, k, v, fused_cache, metadata, kv_written=True)
    return (two_step_out, two_step_cache, two_step_qkv), (fused_out, fused_cache, fused_qkv)


def assert_same(two_step, fused, before_cache, num_tokens):
    (two_step_out, two_step_cache, two_step_qkv), (fused_out, fused_cache, fused_qkv) = two_step, fused
    assert torch.equal(fused_qkv, two_step_qkv)
    assert torch.equal(fused_cache, two_step_cache)
    assert not torch.equal(fused_cache, before_cache)  # the step's k/v did reach the cache
    assert torch.equal(fused_out[:num_tokens], two_step_out[:num_tokens])  # padding rows' output is unspecified


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
def test_kernel_stores_what_write_kv_stores(dtype, block_size, device):
    """The core kernel with the cache against the kernel then the backend's write_kv (slots -1, padding rows)."""
    torch.manual_seed(block_size)
    heads, kv_heads, head_dim, num_tokens = 4, 2, 64, 13
    norm_rope = QKNormRope(head_dim, dtype, device)
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    cache = torch.randn(2, 3, block_size, kv_heads, head_dim, device=device).to(dtype)
    slots = torch.randperm(3 * block_size)[: num_tokens - 2].to(torch.int32).to(device)  # 2 padding rows
    slots[[1, 6]] = -1
    positions = torch.randint(0, 40960, (num_tokens,), device=device)

    ref_qkv, ref_cache = qkv.clone(), cache.clone()
    q, k, v = split(ref_qkv, heads, kv_heads, head_dim)
    norm_rope(positions, q, k)
    n = slots.shape[0]
    write_kv(ref_cache, k[:n], v[:n], slots)

    q, k, v = split(qkv, heads, kv_heads, head_dim)
    norm_rope(positions, q, k, kv_cache=cache, v=v, slot_mapping=slots)
    assert torch.equal(qkv, ref_qkv) and torch.equal(cache, ref_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_after_the_fused_write_equals_forward_that_writes(dtype, device):
    # decodes (no context, one block, a block + 1), a prompt, a prefix-cache hit, a chunk from mid-block
    batch = make_paged_batch([0, 16, 17, 0, 32, 21], [1, 1, 1, 19, 8, 16], num_heads=4, num_kv_heads=2, head_dim=32,
                             block_size=16, dtype=dtype, device=device, seed=3)
    before = batch.kv_cache.clone()
    two_step, fused = attention_both_ways(batch, 4, 2, 32, device)
    assert_same(two_step, fused, before, batch.metadata.num_tokens)


def test_forward_told_kv_is_written_writes_nothing(device):
    batch = make_paged_batch([5, 0], [1, 9], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, device=device)
    backend = make_backend(device, torch.float32, 4, 2, 32)
    before = batch.kv_cache.clone()
    backend.forward(AttentionLayer(0, 4, 2, 32, 0.2), batch.q, batch.k, batch.v, batch.kv_cache,
                    backend.build_metadata(batch.metadata), kv_written=True)
    assert torch.equal(batch.kv_cache, before)
    assert torch.equal(backend.standard_kv_slot_mapping(batch.metadata), batch.metadata.slot_mapping)


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["decode_1", "decode_64", "mixed"])
def test_real_shapes_on_cuda(model, dtype, case):
    contexts, queries = {
        "decode_1": ([3000], [1]),
        "decode_64": ([(97 * i) % 4000 for i in range(64)], [1] * 64),
        "mixed": ([100, 3000, 256, 0, 512, 77], [1, 1, 1, 900, 256, 300]),
    }[case]
    heads, kv_heads, head_dim = REAL_SHAPES[model]
    batch = make_paged_batch(contexts, queries, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                             block_size=16, dtype=dtype, device="cuda", seed=len(contexts))
    before = batch.kv_cache.clone()
    two_step, fused = attention_both_ways(batch, heads, kv_heads, head_dim, "cuda", num_padding=3)
    assert_same(two_step, fused, before, batch.metadata.num_tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
def test_decode_graph_with_the_fused_write_replays_like_the_two_launches(model):
    """One decode layer step (kernel with k/v store, then attention) captured for 8 requests and
    replayed on new lengths, pages and qkv; each replay equals today's two launches run eagerly."""
    heads, kv_heads, head_dim = REAL_SHAPES[model]
    dtype, size = torch.bfloat16, 8
    shape = dict(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, block_size=16, dtype=dtype, device="cuda")
    first = make_paged_batch([8000] * size, [1] * size, seed=1, spare_blocks=64, **shape)
    md = first.metadata
    md.max_seq_len = 8192  # capture for the longest context the graph will serve
    backend = make_backend("cuda", dtype, heads, kv_heads, head_dim)
    metadata = backend.build_metadata(md)
    norm_rope = QKNormRope(head_dim, dtype, "cuda")
    layer = AttentionLayer(0, heads, kv_heads, head_dim, head_dim**-0.5)
    qkv, cache = qkv_buffer(first.q, first.k, first.v), first.kv_cache
    positions = torch.zeros(size, dtype=torch.long, device="cuda")

    def step():
        q, k, v = split(qkv, heads, kv_heads, head_dim)
        norm_rope(positions, q, k, kv_cache=cache, v=v, slot_mapping=backend.standard_kv_slot_mapping(metadata))
        return backend.forward(layer, q, k, v, cache, metadata, kv_written=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    eager = make_backend("cuda", dtype, heads, kv_heads, head_dim)
    for seed, contexts in ((2, [0, 15, 16, 17, 255, 1000, 4000, 7000]), (3, [3000] * size)):
        fresh = make_paged_batch(contexts, [1] * size, seed=seed, **shape)
        assert fresh.kv_cache.shape[1] <= cache.shape[1]
        cache.zero_()
        cache[:, : fresh.kv_cache.shape[1]].copy_(fresh.kv_cache)
        md.seq_lens.copy_(fresh.metadata.seq_lens)
        md.slot_mapping.copy_(fresh.metadata.slot_mapping)
        md.block_tables.zero_()
        md.block_tables[:, : fresh.metadata.block_tables.shape[1]].copy_(fresh.metadata.block_tables)
        new_qkv = qkv_buffer(fresh.q, fresh.k, fresh.v)
        new_positions = torch.randint(0, 40960, (size,), device="cuda")
        qkv.copy_(new_qkv)
        positions.copy_(new_positions)
        ref_cache, ref_qkv = cache.clone(), new_qkv.clone()
        graph.replay()
        torch.cuda.synchronize()

        fresh.metadata.max_seq_len = 8192  # the same split count as the captured launch
        fresh.metadata.block_tables = md.block_tables
        q, k, v = split(ref_qkv, heads, kv_heads, head_dim)
        norm_rope(new_positions, q, k)
        expected = eager.forward(layer, q, k, v, ref_cache, eager.build_metadata(fresh.metadata))
        assert torch.equal(qkv, ref_qkv) and torch.equal(cache, ref_cache)
        assert torch.equal(out, expected), f"replay with contexts {contexts}"
