"""The mixture-of-experts kernels on CUDA at Qwen3-30B-A3B's shapes (128 experts, top-8, hidden 2048, experts of
768), bfloat16, against the torch path in float32. The tiny MoE models under CUDA graphs against HF are
test_hf_parity.py's cuda cases (float32), and test_gpu.py's bfloat16 ones."""

from __future__ import annotations

import pytest
import torch

from infer_core.layers.moe import experts_torch, route
from infer_core.layers.moe.align import align_by_expert

pytestmark = pytest.mark.gpu

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768


@pytest.mark.parametrize("num_tokens", [1, 4, 16, 64, 300, 1024, 4096])  # 1,024: the 64 x 64 tiles
def test_fused_experts_at_qwen3_30b_a3b_shapes(num_tokens):
    from infer_core.layers.fused.moe_align import MAX_ENTRIES, moe_align
    from infer_core.layers.fused.moe_gemm import choose_tiles, fused_experts

    generator = torch.Generator(device="cuda").manual_seed(num_tokens)
    gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=generator) * HIDDEN**-0.5).bfloat16()
    down = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=generator) * INTER**-0.5).bfloat16()
    x = torch.randn(num_tokens, HIDDEN, device="cuda", generator=generator).bfloat16()
    weights, ids = route(torch.randn(num_tokens, EXPERTS, device="cuda", generator=generator), TOP_K, True)
    tiles = choose_tiles(ids.numel(), EXPERTS)
    align = moe_align if ids.numel() <= MAX_ENTRIES else align_by_expert
    out = fused_experts(x, gate_up, down, weights, align(ids, EXPERTS, tiles.block_m), tiles)
    expected = experts_torch(x.float(), gate_up.float(), down.float(), weights, ids)
    error = float((out.float() - expected).norm() / expected.norm())
    assert error < 1e-2, f"{num_tokens} tokens: off the float32 reference by {error:.2e}"


@pytest.mark.parametrize("num_tokens", [1, 16, 128, 300, 512])
def test_one_launch_router_and_grouping_on_cuda(num_tokens):
    from infer_core.layers.fused.moe_align import moe_align
    from infer_core.layers.fused.moe_route import moe_route

    # each row a permutation of distinct bf16 values: which of two tied experts comes first is not defined
    logits = (torch.argsort(torch.rand(num_tokens, EXPERTS, device="cuda"), dim=-1) / 16).bfloat16()
    weights, ids = moe_route(logits, TOP_K, True)
    want_weights, want_ids = route(logits, TOP_K, True)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)
    got, want = moe_align(ids, EXPERTS, 16), align_by_expert(ids, EXPERTS, 16)
    assert torch.equal(got.sorted_ids, want.sorted_ids) and torch.equal(got.expert_ids, want.expert_ids)
    assert torch.equal(got.num_padded, want.num_padded)


@pytest.mark.parametrize("num_tokens", [1, 2])
def test_decode_gemv_experts_at_qwen3_30b_a3b_shapes(num_tokens):
    from infer_core.layers.fused.moe_gemv import moe_gemv_experts, use_moe_gemv

    assert use_moe_gemv(num_tokens, TOP_K, EXPERTS)
    generator = torch.Generator(device="cuda").manual_seed(100 + num_tokens)
    gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=generator) * HIDDEN**-0.5).bfloat16()
    down = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=generator) * INTER**-0.5).bfloat16()
    x = torch.randn(num_tokens, HIDDEN, device="cuda", generator=generator).bfloat16()
    weights, ids = route(torch.randn(num_tokens, EXPERTS, device="cuda", generator=generator), TOP_K, True)
    out = moe_gemv_experts(x, gate_up, down, weights, ids)
    expected = experts_torch(x.float(), gate_up.float(), down.float(), weights, ids)
    error = float((out.float() - expected).norm() / expected.norm())
    assert error < 1e-2, f"{num_tokens} tokens: off the float32 reference by {error:.2e}"
    graph = torch.cuda.CUDAGraph()  # no host sync: the launches capture, and a replay gives the same bits
    with torch.cuda.graph(graph):
        captured = moe_gemv_experts(x, gate_up, down, weights, ids)
    graph.replay()
    assert torch.equal(captured, out)
