"""The fused kernels on CUDA at real shapes (Qwen3-0.6B / Qwen3-8B), through the layers, and under CUDA graphs."""

from __future__ import annotations

import random

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.fused.qk_norm_rope import qk_norm_rope_inplace
from infer_core.layers.norm import RMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig
from infer_core.testing import LogitsRecorder, write_config_checkpoint

pytestmark = pytest.mark.gpu

# (hidden, q heads, kv heads, head_dim, intermediate)
SHAPES = {"qwen3-0.6b": (1024, 16, 8, 128, 3072), "qwen3-8b": (4096, 32, 8, 128, 12288)}
TOKENS = [1, 7, 256, 2048, 16411]  # 16411: past 16k, and no multiple of any block


def make_layers(model: str, dtype: torch.dtype, impl: fused.FusedImpl):
    """(norm, rotary, act) built on the GPU with their ops set to ``impl`` (read when a layer is built)."""
    hidden, _, _, head_dim, _ = SHAPES[model]
    with pytest.MonkeyPatch.context() as patch, torch.device("cuda"):
        for op in ("RMS_NORM", "ROTARY", "SILU_AND_MUL"):
            patch.setattr(fused, op, impl)
        norm = RMSNorm(hidden, 1e-6, dtype=dtype)
        rotary = RotaryEmbedding(head_dim, RopeConfig(theta=1e6), 40960, 40960)
        act = SiluAndMul()
    assert norm.triton == rotary.triton == act.triton == (impl is fused.FusedImpl.TRITON)
    norm.weight.data = torch.randn(hidden, device="cuda").to(dtype)
    return norm, rotary, act


def qkv_views(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return q.reshape(qkv.shape[0], heads, head_dim), k.reshape(qkv.shape[0], kv_heads, head_dim)


@pytest.mark.parametrize("model", sorted(SHAPES))
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_layers_match_torch_at_real_shapes(model, num_tokens, assert_close_to_reference):
    torch.manual_seed(num_tokens)
    dtype = torch.bfloat16
    hidden, heads, kv_heads, head_dim, inter = SHAPES[model]
    norm, rotary, act = make_layers(model, dtype, fused.FusedImpl.TRITON)

    x, residual = (torch.randn(num_tokens, hidden, device="cuda").to(dtype) for _ in range(2))
    out, summed = norm(x, residual)
    ref_out, ref_summed = norm.forward_torch(x, residual)
    assert torch.equal(summed, ref_summed)
    assert_close_to_reference(out, ref_out, ulps=2)
    assert_close_to_reference(norm(x), norm.forward_torch(x), ulps=2)

    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device="cuda").to(dtype)
    positions = torch.randint(0, 40960, (num_tokens,), device="cuda")
    q, k = qkv_views(qkv, heads, kv_heads, head_dim)
    ref_q, ref_k = rotary.forward_torch(positions, q, k)
    v_before = qkv[:, (heads + kv_heads) * head_dim:].clone()
    out_q, out_k = rotary(positions, q, k)
    assert out_q.data_ptr() == qkv.data_ptr()  # rotated where it lies
    assert torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim:], v_before)

    gate_up = (torch.randn(num_tokens, 2 * inter, device="cuda") * 3).to(dtype)
    assert_close_to_reference(act(gate_up), act.forward_torch(gate_up), ulps=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes_and_qk_norm(dtype, assert_close_to_reference):
    torch.manual_seed(0)
    num_tokens, heads, kv_heads, head_dim = 37, 16, 8, 128
    norm, rotary, act = make_layers("qwen3-0.6b", dtype, fused.FusedImpl.TRITON)
    x, residual = (torch.randn(num_tokens, 1024, device="cuda").to(dtype) for _ in range(2))
    out, summed = norm(x, residual)
    ref_out, ref_summed = norm.forward_torch(x, residual)
    assert torch.equal(summed, ref_summed)
    assert_close_to_reference(out, ref_out, ulps=2, fp32_tol=1e-5)
    with torch.device("cuda"):  # built where it runs: it takes the kernel
        q_norm = RMSNorm(head_dim, 1e-6, dtype=dtype)
    assert q_norm.triton
    q_norm.weight.data = torch.randn(head_dim, device="cuda").to(dtype)
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device="cuda").to(dtype)
    q, k = qkv_views(qkv, heads, kv_heads, head_dim)
    assert_close_to_reference(q_norm(q), q_norm.forward_torch(q), ulps=2, fp32_tol=1e-5)
    positions = torch.randint(0, 4096, (num_tokens,), device="cuda")
    ref_q, ref_k = rotary.forward_torch(positions, q, k)
    rotary(positions, q, k)
    assert_close_to_reference(q, ref_q, ulps=0, fp32_tol=1e-5)
    assert_close_to_reference(k, ref_k, ulps=0, fp32_tol=1e-5)
    gate_up = torch.randn(num_tokens, 2 * 3072, device="cuda").to(dtype)
    assert_close_to_reference(act(gate_up), act.forward_torch(gate_up), ulps=1, fp32_tol=1e-5)


def test_torch_impl_is_the_reference_on_cuda():
    torch.manual_seed(1)
    norm, rotary, act = make_layers("qwen3-0.6b", torch.bfloat16, fused.FusedImpl.TORCH)
    x = torch.randn(4, 1024, device="cuda").to(torch.bfloat16)
    assert torch.equal(norm(x), norm.forward_torch(x))
    q, k = torch.randn(4, 16, 128, device="cuda"), torch.randn(4, 8, 128, device="cuda")
    positions = torch.arange(4, device="cuda")
    out_q, _ = rotary(positions, q, k)
    assert out_q.data_ptr() != q.data_ptr()  # torch path: new tensors


def test_kernels_replay_in_a_cuda_graph(assert_close_to_reference):
    """Captured once, replayed on new inputs: the grid depends on shapes only, nothing syncs."""
    torch.manual_seed(2)
    dtype, num_tokens, heads, kv_heads, head_dim = torch.bfloat16, 8, 32, 8, 128
    norm, rotary, act = make_layers("qwen3-8b", dtype, fused.FusedImpl.TRITON)
    x, residual = (torch.randn(num_tokens, 4096, device="cuda").to(dtype) for _ in range(2))
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device="cuda").to(dtype)
    positions = torch.zeros(num_tokens, dtype=torch.long, device="cuda")
    gate_up = torch.randn(num_tokens, 2 * 12288, device="cuda").to(dtype)

    def step():
        out, summed = norm(x, residual)
        q, k = qkv_views(qkv, heads, kv_heads, head_dim)
        rotary(positions, q, k)
        return out, summed, act(gate_up)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile the kernels before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()

    new_x, new_res, new_gate_up = torch.randn_like(x), torch.randn_like(residual), torch.randn_like(gate_up)
    new_qkv, new_pos = torch.randn_like(qkv), torch.randint(0, 40960, (num_tokens,), device="cuda")
    for static, new in ((x, new_x), (residual, new_res), (qkv, new_qkv), (positions, new_pos),
                        (gate_up, new_gate_up)):
        static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_summed = norm.forward_torch(new_x, new_res)
    assert torch.equal(outs[1], ref_summed)
    assert_close_to_reference(outs[0], ref_out, ulps=2)
    ref_q, ref_k = rotary.forward_torch(new_pos, *qkv_views(new_qkv, heads, kv_heads, head_dim))
    q, k = qkv_views(qkv, heads, kv_heads, head_dim)
    assert torch.equal(q, ref_q) and torch.equal(k, ref_k)
    assert_close_to_reference(outs[2], act.forward_torch(new_gate_up), ulps=1)


# --- q-norm + k-norm + rotary in one launch (Qwen3) ----------------------------------------------


def make_qk_layers(head_dim: int, dtype: torch.dtype):
    norms = []
    with torch.device("cuda"):
        for _ in range(2):
            norm = RMSNorm(head_dim, 1e-6, dtype=dtype)
            norm.weight.data = torch.randn(head_dim).to(dtype)
            norms.append(norm)
        return norms[0], norms[1], RotaryEmbedding(head_dim, RopeConfig(theta=1e6), 40960, 40960)


def qk_reference(q_norm, k_norm, rotary, positions, q, k):
    """(normed q, normed k) and those rotated: the three layers' torch code."""
    normed = q_norm.forward_torch(q), k_norm.forward_torch(k)
    return normed, rotary.forward_torch(positions, *normed)


@pytest.mark.parametrize("model", sorted(SHAPES))
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_qk_norm_rope_matches_the_three_layers(model, num_tokens, dtype, assert_rotated_like_reference):
    torch.manual_seed(num_tokens)
    _, heads, kv_heads, head_dim, _ = SHAPES[model]
    q_norm, k_norm, rotary = make_qk_layers(head_dim, dtype)
    qkv = (torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device="cuda") * 2).to(dtype)
    q, k = qkv_views(qkv, heads, kv_heads, head_dim)
    positions = torch.randint(0, 40960, (num_tokens,), device="cuda", dtype=torch.int32)
    (normed_q, normed_k), (ref_q, ref_k) = qk_reference(q_norm, k_norm, rotary, positions, q, k)
    v_before = qkv[:, (heads + kv_heads) * head_dim:].clone()
    out_q, out_k = qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, 1e-6, rotary.cos_sin_cache,
                                        rotary.rot_dim)
    assert out_q.data_ptr() == qkv.data_ptr()  # rewritten where it lies
    assert_rotated_like_reference(out_q, ref_q, normed_q, rotary.rot_dim)
    assert_rotated_like_reference(out_k, ref_k, normed_k, rotary.rot_dim)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim:], v_before)


def test_qk_norm_rope_replays_in_a_cuda_graph(assert_rotated_like_reference):
    torch.manual_seed(3)
    dtype, num_tokens, heads, kv_heads, head_dim = torch.bfloat16, 8, 32, 8, 128
    q_norm, k_norm, rotary = make_qk_layers(head_dim, dtype)
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device="cuda").to(dtype)
    positions = torch.zeros(num_tokens, dtype=torch.long, device="cuda")

    def step():
        q, k = qkv_views(qkv, heads, kv_heads, head_dim)
        qk_norm_rope_inplace(positions, q, k, q_norm.weight, k_norm.weight, 1e-6, rotary.cos_sin_cache,
                             rotary.rot_dim)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    new_qkv, new_pos = torch.randn_like(qkv), torch.randint(0, 40960, (num_tokens,), device="cuda")
    qkv.copy_(new_qkv)
    positions.copy_(new_pos)
    graph.replay()
    torch.cuda.synchronize()
    (normed_q, normed_k), (ref_q, ref_k) = qk_reference(q_norm, k_norm, rotary, new_pos,
                                                        *qkv_views(new_qkv, heads, kv_heads, head_dim))
    q, k = qkv_views(qkv, heads, kv_heads, head_dim)
    assert_rotated_like_reference(q, ref_q, normed_q, rotary.rot_dim)
    assert_rotated_like_reference(k, ref_k, normed_k, rotary.rot_dim)


def _qwen3_greedy(folder, attention: str, prompts, **settings):
    """Greedy tokens and per-step logits; counts calls of layer 0's separate q-norm (0 when fused)."""
    llm = LLM(str(folder), attention=attention, max_num_seqs=16, gpu_memory_utilization=0.4, **settings)
    try:
        calls = []
        attn = llm.engine.executor.worker.runner.model.model.layers[0].self_attn
        assert attn.attn.fused_qk_norm_rope == (fused.QK_NORM_ROPE is fused.FusedImpl.TRITON)
        attn.q_norm.register_forward_hook(lambda *_: calls.append(1))
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                                   use_tqdm=False)
        return ([o.outputs[0].token_ids for o in outputs], [recorder.logits[o.request_id] for o in outputs],
                len(calls))
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("attention", ["flash", "triton"])
def test_qwen3_06b_same_logits_fused_or_three_layers(attention, tmp_path, monkeypatch):
    """Qwen3-0.6B (dummy bf16, CUDA graphs): the fused op (the default) against the three separate kernels.

    q and k reach the attention backend as views into qkv when fused, new contiguous tensors otherwise.
    """
    pytest.importorskip({"flash": "flash_attn", "triton": "infer_attention_triton"}[attention])
    folder = write_config_checkpoint("Qwen3-0.6B", tmp_path / "qwen3-0.6b")
    rng = random.Random(7)
    prompts = [[rng.randrange(0, 151936) for _ in range(rng.randrange(20, 400))] for _ in range(5)]
    settings = dict(load_format="dummy", max_model_len=2048)
    fused_tokens, fused_logits, fused_calls = _qwen3_greedy(folder, attention, prompts, **settings)
    monkeypatch.setattr(fused, "QK_NORM_ROPE", fused.FusedImpl.TORCH)  # read when the model is built
    tokens, logits, calls = _qwen3_greedy(folder, attention, prompts, **settings)
    assert fused_calls == 0 and calls > 0
    assert fused_tokens == tokens
    worst = max(float((a.float() - b.float()).norm() / b.float().norm())
                for steps_a, steps_b in zip(fused_logits, logits) for a, b in zip(steps_a, steps_b))
    assert worst < 2e-2, f"fused vs separate logits differ by {worst:.2e} (relative)"


def test_tiny_qwen3_float32_same_logits_fused_or_three_layers(tiny_checkpoint, monkeypatch):
    prompts = [[5, 9, 13, 200, 31], list(range(3, 60))]
    folder, settings = tiny_checkpoint("qwen3"), dict(dtype="float32", max_model_len=512)
    fused_tokens, fused_logits, fused_calls = _qwen3_greedy(folder, "triton", prompts, **settings)
    monkeypatch.setattr(fused, "QK_NORM_ROPE", fused.FusedImpl.TORCH)
    tokens, logits, calls = _qwen3_greedy(folder, "triton", prompts, **settings)
    assert fused_calls == 0 and calls > 0
    assert fused_tokens == tokens
    for steps_a, steps_b in zip(fused_logits, logits):
        torch.testing.assert_close(torch.stack(steps_a), torch.stack(steps_b), rtol=1e-4, atol=1e-4)
