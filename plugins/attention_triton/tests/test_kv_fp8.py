"""An FP8 KV cache (``INFER_KV_CACHE_DTYPE=fp8``) in the Triton kernels against the torch reference backend.

Every writer stores ``x / scale`` clamped to +-448 as e4m3 (``infer_core.layers.kv_write.quantize_kv``):
the Triton KV write, the q/k-norm + rotary kernel's KV write and the torch write must store the same bytes.
The decode and prefill kernels must read the cache as the torch backend does: the stored keys exactly, with
``k_scale`` in the softmax scale, and ``v_scale`` on the values (``stored * scale`` either way). The
interpreter runs small shapes on the CPU (float32, scales that are not powers of two, so no value falls
on a rounding tie, which the interpreter breaks differently from torch); the tests marked ``gpu`` run
Qwen3-0.6B's shapes in bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from infer_core.builtin.attention_torch import TorchAttentionBackend
from infer_core.interfaces import AttentionLayer, RuntimeContext
from infer_core.layers.fused.kv_write import write_kv
from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.kv_write import FP8_KV_DTYPE, quantize_kv
from infer_core.layers.kv_write import write_kv as torch_write_kv
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig, model_config_from_dict
from infer_core.settings import EngineSettings

from infer_attention_triton.backend import TritonAttentionBackend
from infer_attention_triton.capabilities import validate_context
from infer_attention_triton.testing import make_paged_batch, relative_error

K_SCALE, V_SCALE = 0.37, 0.61


def make_ctx(device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> RuntimeContext:
    model = model_config_from_dict({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "max_position_embeddings": 4096,
    })
    cuda = device == "cuda"
    ctx = RuntimeContext(device, str(dtype).removeprefix("torch."), model, EngineSettings(kv_cache_dtype="fp8"),
                         (9, 0) if cuda else None, int(cuda), not cuda)
    assert validate_context(ctx) == []
    return ctx


def fp8_cache(kv_cache: torch.Tensor) -> torch.Tensor:
    """A random model-dtype cache quantized: what earlier steps would have left in an FP8 cache."""
    return torch.stack([quantize_kv(kv_cache[0], K_SCALE), quantize_kv(kv_cache[1], V_SCALE)])


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == FP8_KV_DTYPE and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def run_mixed_step(device, dtype, heads, kv_heads, head_dim, contexts, queries, seed=5):
    """One step through both backends on copies of one FP8 cache: (triton out, torch out, the two caches)."""
    batch = make_paged_batch(contexts, queries, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                             block_size=16, dtype=dtype, device=device, seed=seed)
    k = batch.k * 100  # some of the new keys beyond +-448 * K_SCALE: the write clamps them
    cache = fp8_cache(batch.kv_cache)
    layer = AttentionLayer(0, heads, kv_heads, head_dim, head_dim**-0.5, k_scale=K_SCALE, v_scale=V_SCALE)
    ctx = make_ctx(device, dtype, heads, kv_heads, head_dim)
    triton_backend = TritonAttentionBackend(ctx)
    triton_cache, torch_cache = cache.clone(), cache.clone()
    metadata = triton_backend.build_metadata(batch.metadata)
    got = triton_backend.forward(layer, batch.q, k, batch.v, triton_cache, metadata)
    expected = TorchAttentionBackend(ctx).forward(layer, batch.q, k, batch.v, torch_cache, batch.metadata)
    return got, expected, triton_cache, torch_cache, metadata


def split_k_context(device: str) -> int:
    """A context the decode launch splits: 9 of the interpreter's 16-key tiles, 17 of the GPU's 64-key ones
    (``choose_num_splits`` keeps at least 4 tiles a split)."""
    return 130 if device == "cpu" else 1030


def test_mixed_step_on_an_fp8_cache_matches_torch(device):
    # decodes of a split-K context and of 5 tokens, a whole prompt, a chunk after a prefix (mid-block)
    got, expected, triton_cache, torch_cache, md = run_mixed_step(
        device, torch.float32, 4, 2, 32, [split_k_context(device), 5, 0, 21], [1, 1, 17, 9])
    assert md.num_splits > 1
    assert same_bytes(triton_cache, torch_cache)  # the new tokens' K/V quantized alike, clamped alike
    assert float(triton_cache[0].float().abs().max()) == 448.0
    assert relative_error(got, expected) < 1e-5


def test_mixed_step_in_bfloat16_on_an_fp8_cache_matches_torch(device):
    """bfloat16, new keys past the e4m3 range (scores of tens to hundreds, near ties between them): both sides
    read the keys exactly, ``k_scale`` in the softmax scale, so only bfloat16 roundings of the probabilities,
    values and outputs part them (~0.5%). A reference that rounds ``stored * k_scale`` to bfloat16 is 3-5% off
    at such near ties, in the prefills (fresh or after a prefix) and in decodes alike."""
    got, expected, triton_cache, torch_cache, md = run_mixed_step(
        device, torch.bfloat16, 4, 2, 32, [split_k_context(device), 5, 1, 0, 40, 21], [1, 1, 1, 60, 30, 9])
    assert md.num_splits > 1
    assert same_bytes(triton_cache, torch_cache)
    assert relative_error(got, expected) < 1e-2


def test_kv_write_kernel_stores_torch_bytes(device):
    gen = torch.Generator().manual_seed(1)
    k = (torch.randn(6, 2, 32, generator=gen) * 200).to(device)  # past +-448 * K_SCALE: clamped
    v = torch.randn(6, 2, 32, generator=gen).to(device)
    slots = torch.tensor([3, 40, -1, 17, 0, 63], dtype=torch.int32, device=device)  # -1: not kept
    cache = torch.zeros(2, 4, 16, 2, 32, dtype=FP8_KV_DTYPE, device=device)
    expected = cache.clone()
    write_kv(cache, k, v, slots, K_SCALE, V_SCALE)
    kept = slots >= 0
    torch_write_kv(expected, k[kept], v[kept], slots[kept], K_SCALE, V_SCALE)
    assert same_bytes(cache, expected)
    assert float(cache.float().abs().max()) == 448.0


def test_qk_norm_rope_stores_quantized_kv(device):
    tokens, heads, kv_heads, head_dim = 5, 4, 2, 32
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(device)
    weights = [torch.randn(head_dim, generator=gen).to(device) * 3 for _ in range(2)]
    rotary = RotaryEmbedding(head_dim, RopeConfig(theta=1e6), 256, 256).to(device)
    positions = torch.tensor([0, 7, 31, 100, 200], device=device)
    slots = torch.tensor([5, 16, -1, 33], dtype=torch.int32, device=device)  # the fifth token: padding

    def run(cache):
        buf = qkv.clone()
        q, k, v = (x.view(tokens, -1, head_dim) for x in buf.split(
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1))
        qk_norm_rope_inplace(positions, q, k, *weights, 1e-6, rotary.cos_sin_cache, rotary.rot_dim, kv_cache=cache,
                             v=v, slot_mapping=slots, k_scale=K_SCALE, v_scale=V_SCALE)
        return buf, k, v

    cache = torch.zeros(2, 4, 16, kv_heads, head_dim, dtype=FP8_KV_DTYPE, device=device)
    buf8, k, v = run(cache)
    buf32, _, _ = run(torch.zeros(2, 4, 16, kv_heads, head_dim, device=device))
    assert torch.equal(buf8, buf32)  # q and k normed and rotated alike, whatever the cache
    expected = torch.zeros_like(cache)
    kept = torch.tensor([0, 1, 3], device=device)  # the tokens with a slot
    torch_write_kv(expected, k[kept], v[kept], slots[kept], K_SCALE, V_SCALE)
    assert same_bytes(cache, expected)


@pytest.mark.gpu
def test_qwen3_shapes_bf16_on_an_fp8_cache_match_torch():
    """Qwen3-0.6B's heads; decodes of long contexts (split-K), prefills with and without a cached prefix.

    The new keys reach the e4m3 range (scores of tens to hundreds): a reference that rounded ``stored * k_scale``
    to bfloat16 was 4.3% off float64 at this step's fresh prompt on the CPU (and Triton 4.4% off it on the
    H100); reading the keys exactly, both sides are within ~0.2-0.5% of float64 (bfloat16 probabilities,
    values and outputs), far inside the bound."""
    got, expected, triton_cache, torch_cache, md = run_mixed_step(
        "cuda", torch.bfloat16, 16, 8, 128, [3000, 700, 1, 0, 512, 100], [1, 1, 1, 300, 77, 16])
    assert md.num_splits > 1
    assert same_bytes(triton_cache, torch_cache)
    assert relative_error(got, expected) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["qwen3", "llama"])  # qwen3: the q/k-norm + rotary kernel writes the KV
def test_engine_on_an_fp8_cache_matches_torch_with_graphs_prefix_hits_and_chunks(tmp_path, kind):
    """The whole engine in bfloat16 on an FP8 cache, CUDA graphs on: Triton against the torch reference."""
    import random

    from infer_core import LLM, SamplingParams
    from infer_core.testing import LogitsRecorder, make_tiny_checkpoint

    folder = make_tiny_checkpoint(kind, tmp_path / kind)
    rng = random.Random(0)
    prefix = [rng.randrange(3, 384) for _ in range(40)]  # two full blocks shared: prefix-cache hits
    prompts = [prefix + [rng.randrange(3, 384) for _ in range(n)] for n in (3, 70, 17, 130)]
    results = {}
    for attention in ("torch", "triton"):
        llm = LLM(str(folder), attention=attention, dtype="bfloat16", kv_cache_dtype="fp8", block_size=16,
                  max_num_seqs=8, max_num_batched_tokens=64, kv_cache_gb=0.05)
        if attention == "triton":
            assert llm.engine.executor.worker.runner.graphs is not None  # decode steps replay CUDA graphs
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                                   use_tqdm=False)
        results[attention] = ([o.outputs[0].token_ids for o in outputs],
                              [recorder.logits[o.request_id] for o in outputs])
        assert llm.engine.stats().prefix_hit_tokens > 0
        llm.shutdown()
    (tokens, logits), (expected_tokens, expected_logits) = results["triton"], results["torch"]
    for g, e, g_logits, e_logits in zip(tokens, expected_tokens, logits, expected_logits):
        parted = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), len(e))
        for step in range(min(parted + 1, len(e))):  # the same history read from the cache: close logits
            ref = e_logits[step].float()
            assert float((g_logits[step].float() - ref).norm() / ref.norm()) < 2e-2, (step, g, e)
        if parted < len(e):  # tokens part only at a near-tie of the reference's logits
            ref = e_logits[parted].float()
            assert float(ref.max() - ref[g[parted]]) <= 0.1 * float(ref.std()), (parted, g, e)
