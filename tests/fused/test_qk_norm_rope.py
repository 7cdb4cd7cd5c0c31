"""Qwen3's q/k norm + rotary kernel against the layers' torch code (the reference), in the interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.norm import RMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig
from infer_core.testing import LogitsRecorder


def make_layers(head_dim: int, dtype: torch.dtype, device: str, *, partial: float = 1.0, rope_type: str = "default",
                eps: float = 1e-6, max_position: int = 4096):
    """(q_norm, k_norm, rotary) with random norm weights, as a Qwen3 attention layer holds them."""
    norms = []
    for _ in range(2):
        norm = RMSNorm(head_dim, eps, dtype=dtype).to(device)
        norm.weight.data = torch.randn(head_dim, device=device).to(dtype)
        norms.append(norm)
    scaling = (("factor", 4.0), ("original_max_position_embeddings", 1024)) if rope_type == "yarn" else ()
    rope = RopeConfig(theta=1e6, rope_type=rope_type, scaling=scaling, partial_rotary_factor=partial)
    return norms[0], norms[1], RotaryEmbedding(head_dim, rope, max_position, max_position).to(device)


def fused_qkv(num_tokens, heads, kv_heads, head_dim, dtype, device):
    """(qkv buffer, q view, k view, v view) as the attention layer makes them."""
    qkv = (torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device=device) * 2).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    shape = (num_tokens, -1, head_dim)
    return qkv, q.reshape(shape), k.reshape(shape), v.reshape(shape)


def reference(q_norm, k_norm, rotary, positions, q, k):
    """What the model runs without the fused op: the normed q and k, and those rotated (new tensors)."""
    normed_q, normed_k = q_norm.forward_torch(q), k_norm.forward_torch(k)
    return (normed_q, normed_k), rotary.forward_torch(positions, normed_q, normed_k)


def check_inplace(check, num_tokens, heads, kv_heads, head_dim, dtype, pos_dtype, device, *, partial=1.0,
                  rope_type="default", block_h=None):
    torch.manual_seed(num_tokens * 131 + heads * 7 + head_dim)
    q_norm, k_norm, rotary = make_layers(head_dim, dtype, device, partial=partial, rope_type=rope_type)
    qkv, q, k, v = fused_qkv(num_tokens, heads, kv_heads, head_dim, dtype, device)
    positions = torch.randint(0, 4096, (num_tokens,), device=device, dtype=pos_dtype)
    (normed_q, normed_k), (ref_q, ref_k) = reference(q_norm, k_norm, rotary, positions, q, k)
    v_before = v.clone()
    out_q, out_k = qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps,
                                        rotary.cos_sin_cache, rotary.rot_dim, block_h=block_h)
    assert out_q is q and out_k is k
    check(q, ref_q, normed_q, rotary.rot_dim)
    check(k, ref_k, normed_k, rotary.rot_dim)
    assert torch.equal(v, v_before)
    # the qkv buffer itself now holds the result
    assert torch.equal(qkv[:, : heads * head_dim].reshape(num_tokens, heads, head_dim), q)
    assert torch.equal(qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].reshape(num_tokens, kv_heads, head_dim),
                       k)


@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 1)])
@pytest.mark.parametrize("num_tokens", [1, 3, 17])
def test_norms_and_rotates_qkv_views_in_place(num_tokens, heads, kv_heads, head_dim, dtype, pos_dtype, device,
                                              assert_rotated_like_reference):
    check_inplace(assert_rotated_like_reference, num_tokens, heads, kv_heads, head_dim, dtype, pos_dtype, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_rotary_norms_the_channels_past_rot_dim(dtype, device, assert_rotated_like_reference):
    """rot_dim = 24 of head_dim 48 (a half of 12, no power of two): the other 24 channels are normed only."""
    check_inplace(assert_rotated_like_reference, 5, 3, 1, 48, dtype, torch.int64, device, partial=0.5)


def test_yarn_cache_and_one_head_per_program(device, assert_rotated_like_reference):
    """The yarn attention factor lives in the cache; block_h=1 puts every head in its own program."""
    check_inplace(assert_rotated_like_reference, 4, 4, 2, 64, torch.float32, torch.int64, device, rope_type="yarn",
                  block_h=1)


def test_head_major_strides(device, assert_rotated_like_reference):
    """q laid out [H, T, D] and seen as [T, H, D]; k contiguous; block_h=2 splits both into several blocks."""
    torch.manual_seed(6)
    q_norm, k_norm, rotary = make_layers(32, torch.float32, device)
    q = torch.randn(3, 6, 32, device=device).transpose(0, 1)
    k = torch.randn(6, 5, 32, device=device)
    positions = torch.arange(10, 16, device=device, dtype=torch.int32)
    (normed_q, normed_k), (ref_q, ref_k) = reference(q_norm, k_norm, rotary, positions, q, k)
    qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps, rotary.cos_sin_cache,
                         rotary.rot_dim, block_h=2)
    assert_rotated_like_reference(q, ref_q, normed_q, rotary.rot_dim)
    assert_rotated_like_reference(k, ref_k, normed_k, rotary.rot_dim)


def test_eps_matters(device):
    """Tiny rows, where the result depends on eps: a kernel that drops or misplaces it fails."""
    q_norm, k_norm, rotary = make_layers(16, torch.float32, device, eps=1e-2)
    positions = torch.tensor([0, 5], device=device)

    def run(eps):
        q, k = torch.full((2, 2, 16), 1e-3, device=device), torch.full((2, 1, 16), 1e-3, device=device)
        return qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, eps, rotary.cos_sin_cache,
                                    rotary.rot_dim)

    q, k = torch.full((2, 2, 16), 1e-3, device=device), torch.full((2, 1, 16), 1e-3, device=device)
    _, (ref_q, ref_k) = reference(q_norm, k_norm, rotary, positions, q, k)
    got_q, got_k = run(1e-2)
    torch.testing.assert_close(got_q, ref_q, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_k, ref_k, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(run(1e-6)[0], ref_q)


def test_no_tokens_and_bad_inputs(device):
    q_norm, k_norm, rotary = make_layers(16, torch.float32, device)
    args = (q_norm.weight, k_norm.weight, 1e-6, rotary.cos_sin_cache, rotary.rot_dim)
    empty_q, empty_k = torch.empty(0, 2, 16, device=device), torch.empty(0, 1, 16, device=device)
    assert qk_norm_rope_inplace(torch.empty(0, dtype=torch.long, device=device), empty_q, empty_k, *args)[0] is empty_q
    positions = torch.zeros(2, dtype=torch.long, device=device)
    q, k = torch.randn(2, 2, 16, device=device), torch.randn(2, 1, 16, device=device)
    with pytest.raises(ValueError, match="one T and D"):
        qk_norm_rope_inplace(positions, q, k[:1], *args)
    with pytest.raises(ValueError, match="share a dtype"):
        qk_norm_rope_inplace(positions, q.half(), k.half(), *args)
    with pytest.raises(ValueError, match="head_dim"):
        qk_norm_rope_inplace(positions, q, k, q_norm.weight[:8], k_norm.weight, 1e-6, rotary.cos_sin_cache, 16)
    with pytest.raises(ValueError, match="rot_dim"):
        qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, 1e-6, rotary.cos_sin_cache, 8)
    with pytest.raises(ValueError, match="one id per token"):
        qk_norm_rope_inplace(positions[:1], q, k, *args)


def attention_layers(llm: LLM) -> list:
    return [layer.self_attn for layer in llm.engine.executor.worker.runner.model.model.layers]


def run_logits(llm: LLM, prompts) -> tuple[list[list[int]], list[torch.Tensor]]:
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return ([o.outputs[0].token_ids for o in outputs],
            [torch.stack(recorder.logits[o.request_id]) for o in outputs])


def test_qwen3_gives_the_same_logits_with_the_fused_op(tiny_checkpoint, request):
    """The tiny Qwen3 on the CPU (float32): built as usual it runs the three layers' torch code; built under the
    interpreter with the CPU listed (``fused.TRITON_DEVICES``) it runs the fused kernel, and no separate layer.

    Forward hooks count calls of the separate layers: the fused run must not make any.
    """
    folder = str(tiny_checkpoint("qwen3"))
    llm = LLM(folder, device="cpu", dtype="float32", block_size=16)
    prompts = [[5, 9, 13, 200, 31], torch.randint(3, 384, (19,), generator=torch.Generator().manual_seed(0)).tolist()]

    def run_counting_layer_calls(llm):
        attns = attention_layers(llm)
        assert all(attn.attn.qk_norm is not None for attn in attns)
        calls = []
        for module in (attns[0].q_norm, attns[0].k_norm, attns[0].rotary):
            module.register_forward_hook(lambda module, args, out: calls.append(type(module).__name__))
        return run_logits(llm, prompts), calls, attns[0].attn.fused_qk_norm_rope

    (tokens, logits), calls, fused = run_counting_layer_calls(llm)
    assert not fused and set(calls) == {"RMSNorm", "RotaryEmbedding"}  # the CPU runs the three layers
    request.getfixturevalue("triton_on_cpu")  # engines built from here on run our kernels on the CPU
    (fused_tokens, fused_logits), calls, fused = run_counting_layer_calls(
        LLM(folder, device="cpu", dtype="float32", block_size=16))
    assert fused and calls == []
    assert fused_tokens == tokens
    for got, expected in zip(fused_logits, logits):
        assert got.shape == expected.shape == (4, 384)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
