"""The W8 GEMV (Triton; interpreted on the CPU at small shapes) against ``x @ dequant(W)^T`` in float64."""

from __future__ import annotations

import pytest
import torch
from infer_quant_w8a8.quantize import dequantize_weight, quantize_weight
from infer_quant_w8a8.schemes import QuantDtype, WeightFormat


def _case(n, k, rows, dtype, group_k, x_dtype, device, bias=True):
    g = torch.Generator().manual_seed(n * 1000 + k + rows)
    w = torch.randn(n, k, generator=g)
    wq, scale = quantize_weight(w, WeightFormat(dtype, group_k))
    x = torch.randn(rows, k, generator=g).to(x_dtype)
    b = torch.randn(n, generator=g).to(x_dtype) if bias else None
    expected = x.double() @ dequantize_weight(wq, scale, group_k).double().T + (b.double() if bias else 0)
    return [t.to(device) if t is not None else None for t in (x, wq, scale, b)], expected


# N=36 leaves a partial column block; K=80 a masked K tail; groups of 16 columns take one scale a K tile
@pytest.mark.parametrize("dtype", list(QuantDtype))
@pytest.mark.parametrize("n, k, rows, group_k", [(36, 80, 1, None), (32, 64, 3, 16)])
def test_w8_gemv_matches_the_dequantized_product(device, dtype, n, k, rows, group_k):
    from infer_quant_w8a8.gemv import w8_gemv

    (x, wq, scale, b), expected = _case(n, k, rows, dtype, group_k, torch.float32, device)
    got = w8_gemv(x, wq, scale, b, group_k)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double().cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_w8_gemv_at_large_k_loads_the_dense_gemv_bytes_a_step(device, dtype):
    """From K=4096 the dense GEMV's K step is 8 x 1024 bf16 values (16 KiB): the 8-bit one takes 8 x 2048 (the
    same bytes), never past K or a scale group; and its sums over those wider steps are still the product."""
    from infer_core.layers.fused.gemv_tiles import choose_config, num_sms
    from infer_quant_w8a8.gemv import tiles, w8_gemv

    dev = torch.device(device)
    for n, k in ((6144, 4096), (4096, 12288), (24576, 4096)):
        dense = choose_config(n, k, 2, num_sms(dev))
        assert tiles(n, k, None, dev) == (dense.block_n, 2 * dense.block_k, dense.num_warps)
    assert tiles(6144, 4096, 128, dev)[1] == 128
    (x, wq, scale, b), expected = _case(8, 4096, 1, dtype, None, torch.float32, device)
    torch.testing.assert_close(w8_gemv(x, wq, scale, b).double().cpu(), expected, rtol=1e-5, atol=1e-4)


def test_w8_gemv_rounds_once_to_bfloat16(device):
    from infer_quant_w8a8.gemv import w8_gemv

    (x, wq, scale, b), expected = _case(32, 64, 2, QuantDtype.INT8, None, torch.bfloat16, device)
    got = w8_gemv(x, wq, scale, b)
    assert got.dtype == torch.bfloat16
    # one rounding of the float32 sum: within a bfloat16 step (the interpreter truncates) of the exact value
    step = expected.abs() * 2.0**-7 + 1e-3
    assert bool(((got.double().cpu() - expected).abs() <= step).all())


# K=80 leaves a masked K tail, groups of 16 columns a scale a K step (the halved step stays 16 wide), N=36 a
# partial column block of the 18 outputs
@pytest.mark.parametrize("dtype", list(QuantDtype))
@pytest.mark.parametrize("n, k, rows, group_k, x_dtype", [(36, 80, 1, None, torch.bfloat16),
                                                          (32, 64, 3, 16, torch.bfloat16),
                                                          (40, 48, 2, None, torch.float32),
                                                          # groups of 32 and 128 (several halved K steps each) and
                                                          # of 8 (a K step no wider than one)
                                                          (32, 256, 2, 32, torch.float32),
                                                          (32, 256, 1, 128, torch.float32),
                                                          (32, 256, 2, 8, torch.float32)])
def test_w8_gemv_with_silu_is_the_gemv_then_silu_and_mul(device, dtype, n, k, rows, group_k, x_dtype):
    """gate_up's SiLU-and-mul in the GEMV's epilogue: silu(gate) * up of the exact products, within float32 sums
    (the fused program's K step is half the plain one's: the same sums in another order) and the activation's
    roundings to x's dtype; and against the plain GEMV then the SiLU-and-mul kernel, within one rounding."""
    from infer_core.layers.fused.silu_and_mul import silu_and_mul
    from infer_quant_w8a8.gemv import w8_gemv

    (x, wq, scale, b), exact = _case(n, k, rows, dtype, group_k, x_dtype, device)
    got = w8_gemv(x, wq, scale, b, group_k, silu=True)
    assert got.shape == (rows, n // 2) and got.dtype == x_dtype
    gate, up = exact.chunk(2, dim=-1)
    expected = gate * torch.sigmoid(gate) * up
    two_launches = silu_and_mul(w8_gemv(x, wq, scale, b, group_k)).double().cpu()
    if x_dtype == torch.float32:  # float32 sums of up to 256 products in other orders: within 1e-4 of O(1) values
        torch.testing.assert_close(got.double().cpu(), expected, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got.double().cpu(), two_launches, rtol=1e-5, atol=1e-4)
    else:  # gate, up, silu(gate) and the product each rounded to bfloat16 (truncated by the interpreter: a step
        # each), a rounding of gate moving silu(gate) by up to |gate| times as much where gate is negative
        step = expected.abs() * 2.0**-7 * (4 + gate.abs()) + 1e-3
        assert bool(((got.double().cpu() - expected).abs() <= step).all())
        assert bool(((got.double().cpu() - two_launches).abs() <= step).all())
    with pytest.raises(ValueError, match="even row count"):
        w8_gemv(x, wq[:-1], scale[:-1], None, group_k, silu=True)


def test_w8_gemv_refuses_more_rows_than_a_decode_batch(device):
    from infer_quant_w8a8.gemv import MAX_ROWS, w8_gemv

    (x, wq, scale, _), _ = _case(32, 64, MAX_ROWS + 1, QuantDtype.INT8, None, torch.float32, device, bias=False)
    with pytest.raises(ValueError, match="at most 8 rows"):
        w8_gemv(x, wq, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_w8_gemv_on_the_gpu_at_qwen3_8b_shapes(dtype):
    from infer_quant_w8a8.gemv import w8_gemv

    for n, k, group_k in ((6144, 4096, None), (4096, 12288, None), (24576, 4096, 128)):
        (x, wq, scale, b), expected = _case(n, k, 1, dtype, group_k, torch.bfloat16, "cuda")
        got = w8_gemv(x, wq, scale, b, group_k).double().cpu()
        assert bool(((got - expected).abs() <= expected.abs() * 2.0**-8 + 1e-2).all())
