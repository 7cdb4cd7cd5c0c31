"""The ``torch`` backend with k/v already stored by the q/k-norm + rotary kernel (``kv_written=True``).

A mixed step (decodes, a fresh prompt, a prefix-cache hit, padding rows) runs both ways: today's
(the kernel on q and k, then ``forward`` writes k/v and attends) and the fused one (the kernel also
stores k/v at ``standard_kv_slot_mapping``, ``forward`` only attends). Output and cache must be
equal (``torch.equal``). The kernel runs in Triton's interpreter on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from infer_core.builtin.attention_torch import TorchAttentionBackend
from infer_core.interfaces import AttentionBackend, AttentionLayer, BatchMetadata, RuntimeContext
from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig, model_config_from_dict
from infer_core.settings import EngineSettings

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 32, 16
# (tokens already cached, new tokens) per request, decode-only first, as the runner orders them
REQUESTS = [(0, 1), (16, 1), (17, 1), (0, 19), (32, 8)]
NUM_PADDING = 2


def make_step(device: str, dtype: torch.dtype, seed: int = 0):
    """Metadata of REQUESTS with blocks scattered over the pool, a cache holding random context, and
    the qkv output of the step (real tokens plus padding rows, which get no slot)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in REQUESTS]
    blocks = [-(-s // BLOCK_SIZE) for s in seq_lens]
    order = torch.randperm(sum(blocks) + 2, generator=gen).to(torch.int32)
    block_tables = torch.zeros(len(REQUESTS), max(blocks), dtype=torch.int32)
    slots, used = [], 0
    for i, ((context, new), n) in enumerate(zip(REQUESTS, blocks)):
        block_tables[i, :n] = order[used: used + n]
        used += n
        positions = torch.arange(context, context + new)
        slots.append(block_tables[i, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE)
    query_lens = torch.tensor([n for _, n in REQUESTS], dtype=torch.int32)
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int32), query_lens.cumsum(0, dtype=torch.int32)])
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    num_tokens = int(query_lens.sum())
    metadata = BatchMetadata(
        num_reqs=len(REQUESTS), num_tokens=num_tokens, num_decode_only=3, max_query_len=int(query_lens.max()),
        max_seq_len=max(seq_lens), block_size=BLOCK_SIZE, query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens_t.to(device), block_tables=block_tables.to(device),
        slot_mapping=torch.cat(slots).to(torch.int32).to(device), query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
    )
    cache = torch.randn(2, len(order), BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
    rows = num_tokens + NUM_PADDING
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype).to(device)
    return metadata, cache, qkv


def make_ctx(device: str, dtype: torch.dtype) -> RuntimeContext:
    model = model_config_from_dict({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
    })
    return RuntimeContext(device, str(dtype).removeprefix("torch."), model, EngineSettings())


def split_qkv(qkv: torch.Tensor):
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    return (x.reshape(qkv.shape[0], -1, HEAD_DIM) for x in (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_after_the_fused_write_equals_forward_that_writes(dtype, device):
    metadata, cache, qkv = make_step(device, dtype)
    q_weight, k_weight = (torch.randn(HEAD_DIM, device=device).to(dtype) for _ in range(2))
    rotary = RotaryEmbedding(HEAD_DIM, RopeConfig(theta=1e6), 4096, 4096).to(device)
    positions = torch.randint(0, 64, (qkv.shape[0],), device=device)
    norm_rope = (q_weight, k_weight, 1e-6, rotary.cos_sin_cache, rotary.rot_dim)
    backend = TorchAttentionBackend(make_ctx(device, dtype))
    layer = AttentionLayer(0, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5)

    two_step_cache, two_step_qkv = cache.clone(), qkv.clone()
    q, k, v = split_qkv(two_step_qkv)
    qk_norm_rope_inplace(positions, q, k, *norm_rope)
    expected = backend.forward(layer, q, k, v, two_step_cache, metadata)

    slot_mapping = backend.standard_kv_slot_mapping(metadata)
    assert slot_mapping.shape == (metadata.num_tokens,)
    q, k, v = split_qkv(qkv)
    qk_norm_rope_inplace(positions, q, k, *norm_rope, kv_cache=cache, v=v, slot_mapping=slot_mapping)
    out = backend.forward(layer, q, k, v, cache, metadata, kv_written=True)

    assert torch.equal(cache, two_step_cache) and torch.equal(qkv, two_step_qkv)
    assert torch.equal(out, expected)
    unwritten = make_step(device, dtype)[1]
    assert not torch.equal(two_step_cache, unwritten)  # the step does write k/v ...
    before = unwritten.clone()
    backend.forward(layer, q, k, v, unwritten, metadata, kv_written=True)
    assert torch.equal(unwritten, before)  # ... but not inside forward when told it is written


def test_another_layout_keeps_its_own_write():
    """A backend that does not override ``standard_kv_slot_mapping`` is never handed written k/v."""

    class OtherLayout(AttentionBackend):
        def forward(self, layer, q, k, v, kv_cache, metadata):
            raise NotImplementedError

    backend = OtherLayout(make_ctx("cpu", torch.float32))
    assert backend.standard_kv_slot_mapping(make_step("cpu", torch.float32)[0]) is None
def test_qwen3_stores_kv_in_the_fused_op_and_the_backend_skips_its_write(tiny_checkpoint, monkeypatch, triton_on_cpu):
    """The tiny Qwen3 built on the CPU for our kernels (interpreted), so with the fused q/k-norm + rotary: the
    torch backend's own KV write never runs, and the logits equal (torch.equal) those of the same model whose
    backend keeps the write (``standard_kv_slot_mapping`` None, as a backend of another layout)."""
    from infer_core import LLM, SamplingParams
    from infer_core.builtin import attention_torch
    from infer_core.testing import LogitsRecorder

    writes = []
    write_kv = attention_torch.write_kv
    monkeypatch.setattr(attention_torch, "write_kv", lambda *args: writes.append(1) or write_kv(*args))
    # no prefix cache: the second run must compute what the first did, not read it
    llm = LLM(str(tiny_checkpoint("qwen3")), device="cpu", dtype="float32", block_size=16, enable_prefix_caching=False)
    runner = llm.engine.executor.worker.runner
    assert all(layer.self_attn.attn.fused_qk_norm_rope for layer in runner.model.model.layers)
    prompts = [[5, 9, 13, 200, 31], torch.randint(3, 384, (19,), generator=torch.Generator().manual_seed(0)).tolist()]

    def run():
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        return [torch.stack(recorder.logits[o.request_id]) for o in outputs]

    fused = run()
    assert writes == []
    monkeypatch.setattr(runner.attention, "standard_kv_slot_mapping", lambda metadata: None)
    unfused = run()
    assert writes  # the backend wrote k/v itself
    assert all(torch.equal(a, b) for a, b in zip(fused, unfused))
