"""The numerics of quantizing and of the reference W8A8 product, against float64 arithmetic written out here."""

from __future__ import annotations

import pytest
import torch
from infer_quant_w8a8.quantize import (
    dequantize_weight,
    expand_block_scales,
    quantize_activations,
    quantize_weight,
    reference_linear,
)
from infer_quant_w8a8.schemes import ActivationFormat, LinearScheme, QuantDtype, WeightFormat


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_per_channel_weights_round_trip_within_half_a_step(dtype):
    w = _seeded(48, 80).float()
    w[3] = 0.0  # a row of zeros quantizes to zeros
    q, scale = quantize_weight(w, WeightFormat(dtype))
    assert q.dtype == (torch.int8 if dtype is QuantDtype.INT8 else torch.float8_e4m3fn) and scale.shape == (48, 1)
    assert torch.equal(scale[:, 0], (w.abs().amax(1) / dtype.max_value).clamp(min=1e-12))
    back = dequantize_weight(q, scale).double()
    err = (back - w.double()).abs()
    if dtype is QuantDtype.INT8:
        assert bool((err <= scale.double() / 2 + 1e-7).all())
        assert int(q.abs().amax(1).min(0).values) == 0 and int(q.abs().amax()) == 127  # each row's largest -> 127
    else:  # e4m3 keeps 3 mantissa bits: within 2**-4 of each magnitude (subnormals: within half their step)
        assert bool((err <= w.double().abs() / 16 + scale.double() * 2.0**-10).all())
    assert bool((back[3] == 0).all())


def test_grouped_weights_take_one_scale_per_row_and_group_and_pad_the_last():
    w = _seeded(8, 100).float()
    q, scale = quantize_weight(w, WeightFormat(QuantDtype.FP8, group_k=32))
    assert scale.shape == (8, 4)  # 32, 32, 32 and the last 4 columns
    for g, cols in enumerate((slice(0, 32), slice(32, 64), slice(64, 96), slice(96, 100))):
        assert torch.equal(scale[:, g], w[:, cols].abs().amax(1) / 448.0)
    torch.testing.assert_close(dequantize_weight(q, scale, 32), w, rtol=2**-4, atol=1e-6)


def test_block_scales_repeat_over_their_rows():
    block = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert torch.equal(expand_block_scales(block, 5, 3), torch.tensor([[1.0, 2], [1, 2], [1, 2], [3, 4], [3, 4]]))


def test_per_token_activations_and_a_static_scale():
    x = _seeded(5, 64, seed=1).float()
    q, scale = quantize_activations(x, ActivationFormat(QuantDtype.INT8))
    assert torch.equal(scale[:, 0], x.abs().amax(1) / 127)
    assert torch.equal(q, (x / scale).round().clamp(-127, 127).to(torch.int8))
    static = torch.tensor([0.01])
    q, scale = quantize_activations(x, ActivationFormat(QuantDtype.INT8, static=True), static)
    assert scale.shape == (1, 1) and int(q.max()) == 127 and int(q.min()) == -127  # values beyond 1.27 saturate


@pytest.mark.parametrize("dtype", list(QuantDtype))
@pytest.mark.parametrize("group_k", [None, 16])
def test_reference_linear_is_the_w8a8_sum_written_out(dtype, group_k):
    scheme = LinearScheme(WeightFormat(dtype, group_k), ActivationFormat(dtype, group_k=group_k))
    x, w, bias = _seeded(3, 48, seed=2).float(), _seeded(24, 48, seed=3).float(), _seeded(24, seed=4).float()
    wq, w_scale = quantize_weight(w, scheme.weight)
    got = reference_linear(x, wq, w_scale, scheme, bias)
    xq, x_scale = quantize_activations(x, scheme.activation)
    groups = w_scale.shape[1]
    size = 48 // groups
    expected = torch.zeros(3, 24, dtype=torch.float64)
    for g in range(groups):  # each group's products summed exactly, then both scales
        cols = slice(g * size, (g + 1) * size)
        expected += (xq[:, cols].double() @ wq[:, cols].double().T) * x_scale[:, g, None].double() * w_scale[:, g].double()
    expected += bias.double()
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    # and it approximates the unquantized product: int8 within 2%, e4m3 within 8% of its magnitude
    exact = x.double() @ w.double().T + bias.double()
    rel = float((got.double() - exact).norm() / exact.norm())
    assert rel < (0.02 if dtype is QuantDtype.INT8 else 0.08), rel


def test_schemes_refuse_mixed_types_and_mismatched_groups():
    with pytest.raises(ValueError, match="like types"):
        LinearScheme(WeightFormat(QuantDtype.INT8), ActivationFormat(QuantDtype.FP8))
    with pytest.raises(ValueError, match="groups"):
        LinearScheme(WeightFormat(QuantDtype.FP8, 128), ActivationFormat(QuantDtype.FP8, group_k=64))
