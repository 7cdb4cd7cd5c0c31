"""The fused kernels on CUDA at real shapes (Qwen3-0.6B / Qwen3-8B), through the layers, and under CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.norm import RMSNorm
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig

pytestmark = pytest.mark.gpu

# (hidden, q heads, kv heads, head_dim, intermediate)
SHAPES = {"qwen3-0.6b": (1024, 16, 8, 128, 3072), "qwen3-8b": (4096, 32, 8, 128, 12288)}
TOKENS = [1, 7, 256, 2048, 16411]  # 16411: past 16k, and no multiple of any block


def make_layers(model: str, dtype: torch.dtype, impl: fused.FusedImpl):
    hidden, _, _, head_dim, _ = SHAPES[model]
    norm = RMSNorm(hidden, 1e-6, dtype=dtype).cuda()
    norm.weight.data = torch.randn(hidden, device="cuda").to(dtype)
    rotary = RotaryEmbedding(head_dim, RopeConfig(theta=1e6), 40960, 40960).cuda()
    act = SiluAndMul()
    for layer in (norm, rotary, act):
        layer.impl = impl
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
    q_norm = RMSNorm(head_dim, 1e-6, dtype=dtype).cuda()
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
