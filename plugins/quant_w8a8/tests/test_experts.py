"""8-bit experts: the core's grouped GEMMs and decode GEMVs with int8 / e4m3 weights and per-row scales (Triton's
interpreter on the CPU, the kernels on CUDA) against the torch path, which is the dense experts on the dequantized
weights."""

from __future__ import annotations

import pytest
import torch
from infer_core.layers.fused.moe_gemm import choose_tiles, fused_experts
from infer_core.layers.fused.moe_gemv import moe_gemv_experts
from infer_core.layers.moe.align import align_by_expert
from infer_core.layers.moe.routing import route
from infer_core.layers.moe.unquantized import experts_torch
from infer_quant_w8a8.quantize import dequantize_weight, quantize_weight
from infer_quant_w8a8.schemes import QuantDtype, WeightFormat


def quantized_experts(num_experts: int, hidden: int, inter: int, dtype: QuantDtype, seed: int):
    """(gate_up q, gate_up scales, down q, down scales, dequantized gate_up, dequantized down), each expert's rows
    quantized as the plugin's loader does."""
    g = torch.Generator().manual_seed(seed)
    fmt = WeightFormat(dtype)
    out = []
    for shape, fan_in in (((2 * inter, hidden), hidden), ((hidden, inter), inter)):
        weights = [torch.randn(*shape, generator=g) * fan_in**-0.5 for _ in range(num_experts)]
        pairs = [quantize_weight(w, fmt) for w in weights]
        out.append((torch.stack([q for q, _ in pairs]), torch.stack([s[:, 0] for _, s in pairs]),
                    torch.stack([dequantize_weight(q, s) for q, s in pairs])))
    (gq, gs, gd), (dq, ds, dd) = out
    return gq, gs, dq, ds, gd, dd


def routing(num_tokens: int, num_experts: int, top_k: int, seed: int):
    logits = torch.randn(num_tokens, num_experts, generator=torch.Generator().manual_seed(seed))
    return route(logits, top_k, True)


@pytest.mark.parametrize("qdtype", list(QuantDtype))
@pytest.mark.parametrize("act_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(3, 4, 2), (40, 2, 1), (70, 4, 3)])
def test_grouped_gemms_with_8_bit_weights_match_the_torch_path(device, qdtype, act_dtype, num_tokens, num_experts,
                                                               top_k):
    gq, gs, dq, ds, gd, dd = quantized_experts(num_experts, 48, 40, qdtype, seed=num_tokens)
    x = torch.randn(num_tokens, 48, generator=torch.Generator().manual_seed(7)).to(act_dtype)
    weights, ids = routing(num_tokens, num_experts, top_k, seed=num_tokens + 1)
    # the torch path with scales is the dense experts on the dequantized weights (float32: the same sums)
    scaled = experts_torch(x.float(), gq, dq, weights, ids, gs, ds)
    torch.testing.assert_close(scaled, experts_torch(x.float(), gd, dd, weights, ids), rtol=1e-5, atol=1e-5)
    tiles = choose_tiles(ids.numel(), num_experts)
    blocks = align_by_expert(ids.to(device), num_experts, tiles.block_m)
    got = fused_experts(x.to(device), gq.to(device), dq.to(device), weights.to(device), blocks, tiles,
                        gate_up_scale=gs.to(device), down_scale=ds.to(device)).cpu()
    assert got.dtype == act_dtype
    if act_dtype == torch.float32:
        torch.testing.assert_close(got, scaled, rtol=1e-5, atol=1e-5)
    else:  # bfloat16 activations and intermediate: within 1% in norm of the float32 sums
        assert float((got.float() - scaled).norm() / scaled.norm()) < 1e-2


@pytest.mark.parametrize("qdtype", list(QuantDtype))
def test_8_bit_experts_of_another_rank_count_as_zero(device, qdtype):
    gq, gs, dq, ds, gd, dd = quantized_experts(4, 32, 16, qdtype, seed=3)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4))
    weights, ids = routing(5, 6, 2, seed=9)  # ids 4 and 5: another rank's experts
    local = torch.where(ids < 4, ids, 4)
    tiles = choose_tiles(ids.numel(), 6)
    got = fused_experts(x.to(device), gq.to(device), dq.to(device), weights.to(device),
                        align_by_expert(local.to(device), 4, tiles.block_m), tiles, local_ids=local.to(device),
                        gate_up_scale=gs.to(device), down_scale=ds.to(device)).cpu()
    torch.testing.assert_close(got, experts_torch(x, gd, dd, weights, local), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qdtype", list(QuantDtype))
@pytest.mark.parametrize("num_tokens,top_k,hidden,inter", [(1, 4, 64, 48), (2, 2, 48, 40)])
def test_decode_gemvs_with_8_bit_weights_match_the_torch_path(device, qdtype, num_tokens, top_k, hidden, inter):
    """At a token or two the GEMVs over the entries (an odd K tail on both launches in the second case); one
    entry an expert of another rank (id 6 of 6 here)."""
    gq, gs, dq, ds, gd, dd = quantized_experts(6, hidden, inter, qdtype, seed=11)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(12))
    weights, ids = routing(num_tokens, 7, top_k, seed=13)
    local = torch.where(ids < 6, ids, 6)
    got = moe_gemv_experts(x.to(device), gq.to(device), dq.to(device), weights.to(device), local.to(device),
                           gate_up_scale=gs.to(device), down_scale=ds.to(device)).cpu()
    torch.testing.assert_close(got, experts_torch(x, gd, dd, weights, local), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="need both scales"):
        moe_gemv_experts(x.to(device), gq.to(device), dq.to(device), weights.to(device), local.to(device))


def test_8_bit_weights_without_their_scales_or_with_wrong_ones_are_refused():
    gq, gs, dq, ds, *_ = quantized_experts(2, 32, 16, QuantDtype.INT8, seed=1)
    x = torch.randn(3, 32)
    weights, ids = routing(3, 2, 1, seed=2)
    tiles = choose_tiles(ids.numel(), 2)
    blocks = align_by_expert(ids, 2, tiles.block_m)
    with pytest.raises(ValueError, match="need both scales"):
        fused_experts(x, gq, dq, weights, blocks, tiles)
    with pytest.raises(ValueError, match=r"must be float32 \[E, 2I\]"):
        fused_experts(x, gq, dq, weights, blocks, tiles, gate_up_scale=gs[:, :8].contiguous(), down_scale=ds)
