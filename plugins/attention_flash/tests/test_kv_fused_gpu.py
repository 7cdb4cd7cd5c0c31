"""flash with k/v stored by the core's q/k-norm + rotary kernel (``forward(..., kv_written=True)``).

Today's path per layer: ``qk_norm_rope_inplace`` on q and k, then ``forward``, which writes k/v
and attends. The fused path passes the cache, v and ``standard_kv_slot_mapping`` to the kernel
and tells ``forward`` that k/v are written. Both must leave qkv and the cache equal and give the
same output (``torch.equal``), at Qwen3-0.6B and Qwen3-8B shapes, eagerly and replayed from a CUDA
graph. Run with ``python -m pytest -q -m gpu plugins/attention_flash/tests/test_kv_fused_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from infer_core.interfaces import AttentionLayer, BatchMetadata, RuntimeContext
from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig, model_config_from_dict
from infer_core.settings import EngineSettings

pytestmark = pytest.mark.gpu

BLOCK_SIZE = 256
REAL_SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}  # (query heads, kv heads, head_dim)
# (tokens already cached, new tokens) per request, decode-only requests first
CASES = {
    "decode_1": [(3000, 1)],
    "decode_64": [((97 * i) % 4000, 1) for i in range(64)],
    "mixed": [(40, 1), (700, 1), (0, 300), (256, 64), (1000, 17), (511, 600)],
}


def make_backend(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int):
    from infer_attention_flash.backend import FlashAttentionBackend

    model = model_config_from_dict({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim,
    })
    ctx = RuntimeContext("cuda", str(dtype).removeprefix("torch."), model, EngineSettings(),
                         torch.cuda.get_device_capability(), 1)
    return FlashAttentionBackend(ctx)


def make_step(requests, heads, kv_heads, head_dim, dtype, seed, num_padding=0, num_blocks=None):
    """(metadata, cache with random context, qkv output of the step incl. padding rows)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in requests]
    blocks = [-(-s // BLOCK_SIZE) for s in seq_lens]
    num_blocks = num_blocks or sum(blocks) + 3
    pool = torch.randperm(num_blocks, generator=g).tolist()
    block_tables = torch.zeros(len(requests), max(blocks), dtype=torch.int32)
    slots = []
    for i, (count, (context, new)) in enumerate(zip(blocks, requests)):
        block_tables[i, :count] = torch.tensor([pool.pop() for _ in range(count)], dtype=torch.int32)
        slots += [int(block_tables[i, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in range(context,
                                                                                                    context + new)]
    query_lens = [n for _, n in requests]
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    metadata = BatchMetadata(
        num_reqs=len(requests), num_tokens=len(slots), num_decode_only=sum(1 for n in query_lens if n == 1),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_size=BLOCK_SIZE,
        query_start_loc=query_start_loc.cuda(), seq_lens=seq_lens_t.cuda(), block_tables=block_tables.cuda(),
        slot_mapping=torch.tensor(slots, dtype=torch.int32).cuda(), query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
    )
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, kv_heads, head_dim, generator=g).to(dtype).cuda()
    qkv = torch.randn(len(slots) + num_padding, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype).cuda()
    return metadata, cache, qkv


def split(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return (x.view(qkv.shape[0], -1, head_dim) for x in (q, k, v))


class QKNormRope:
    def __init__(self, head_dim: int, dtype: torch.dtype) -> None:
        self.q_weight, self.k_weight = (torch.randn(head_dim, device="cuda").to(dtype) for _ in range(2))
        self.rotary = RotaryEmbedding(head_dim, RopeConfig(theta=1e6), 40960, 40960).cuda()

    def __call__(self, positions, q, k, **kv) -> None:
        qk_norm_rope_inplace(positions, q, k, self.q_weight, self.k_weight, 1e-6, self.rotary.cos_sin_cache,
                             self.rotary.rot_dim, **kv)


@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_after_the_fused_write_equals_forward_that_writes(model, dtype, case):
    torch.manual_seed(len(CASES[case]))
    heads, kv_heads, head_dim = REAL_SHAPES[model]
    metadata, cache, qkv = make_step(CASES[case], heads, kv_heads, head_dim, dtype, seed=3, num_padding=3)
    backend = make_backend(dtype, heads, kv_heads, head_dim)
    flash_md = backend.build_metadata(metadata)
    norm_rope = QKNormRope(head_dim, dtype)
    layer = AttentionLayer(0, heads, kv_heads, head_dim, head_dim**-0.5)
    positions = torch.randint(0, 40960, (qkv.shape[0],), device="cuda")

    two_step_qkv, two_step_cache = qkv.clone(), cache.clone()
    q, k, v = split(two_step_qkv, heads, kv_heads, head_dim)
    norm_rope(positions, q, k)
    expected = backend.forward(layer, q, k, v, two_step_cache, flash_md)

    before = cache.clone()
    q, k, v = split(qkv, heads, kv_heads, head_dim)
    slot_mapping = backend.standard_kv_slot_mapping(flash_md)
    assert slot_mapping.shape == (metadata.num_tokens,)
    norm_rope(positions, q, k, kv_cache=cache, v=v, slot_mapping=slot_mapping)
    out = backend.forward(layer, q, k, v, cache, flash_md, kv_written=True)
    torch.cuda.synchronize()
    assert torch.equal(qkv, two_step_qkv)
    assert torch.equal(cache, two_step_cache) and not torch.equal(cache, before)
    assert torch.equal(out, expected)

    untouched = before.clone()
    backend.forward(layer, q, k, v, untouched, flash_md, kv_written=True)
    assert torch.equal(untouched, before)  # told k/v are written, forward writes nothing


@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
def test_decode_graph_with_the_fused_write_replays_like_the_two_launches(model):
    heads, kv_heads, head_dim = REAL_SHAPES[model]
    dtype, size, max_context, pool_blocks = torch.bfloat16, 8, 2000, 8 * 8 + 3
    width = -(-(max_context + 1) // BLOCK_SIZE)
    backend, eager = (make_backend(dtype, heads, kv_heads, head_dim) for _ in range(2))
    norm_rope = QKNormRope(head_dim, dtype)
    layer = AttentionLayer(0, heads, kv_heads, head_dim, head_dim**-0.5)

    def decode_step(seed):
        g = torch.Generator().manual_seed(seed)
        contexts = torch.randint(0, max_context, (size,), generator=g).tolist()
        return make_step([(c, 1) for c in contexts], heads, kv_heads, head_dim, dtype, seed, num_blocks=pool_blocks)

    static, cache, qkv = decode_step(0)  # the graph reads these tensors; each replay copies into them
    block_tables = torch.zeros(size, width, dtype=torch.int32, device="cuda")
    block_tables[:, : static.block_tables.shape[1]] = static.block_tables
    static.block_tables = block_tables
    static.max_seq_len = max_context + 1
    flash_md = backend.build_metadata(static)
    positions = torch.zeros(size, dtype=torch.long, device="cuda")

    def step():
        q, k, v = split(qkv, heads, kv_heads, head_dim)
        norm_rope(positions, q, k, kv_cache=cache, v=v, slot_mapping=backend.standard_kv_slot_mapping(flash_md))
        return backend.forward(layer, q, k, v, cache, flash_md, kv_written=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    for seed in (1, 2, 3):
        fresh, fresh_cache, fresh_qkv = decode_step(seed)
        new_positions = torch.randint(0, 40960, (size,), device="cuda")
        cache.copy_(fresh_cache)
        qkv.copy_(fresh_qkv)
        positions.copy_(new_positions)
        static.seq_lens.copy_(fresh.seq_lens)
        static.slot_mapping.copy_(fresh.slot_mapping)
        static.block_tables.zero_()
        static.block_tables[:, : fresh.block_tables.shape[1]] = fresh.block_tables
        fresh.block_tables, fresh.max_seq_len = static.block_tables.clone(), static.max_seq_len  # same launch shape
        graph.replay()

        q, k, v = split(fresh_qkv, heads, kv_heads, head_dim)
        norm_rope(new_positions, q, k)
        expected = eager.forward(layer, q, k, v, fresh_cache, eager.build_metadata(fresh))
        torch.cuda.synchronize()
        assert torch.equal(qkv, fresh_qkv) and torch.equal(cache, fresh_cache), f"replay {seed}"
        assert torch.equal(out, expected), f"replay {seed}"
