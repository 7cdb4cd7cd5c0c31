"""The one-launch activation quantization (Triton; interpreted on the CPU at small shapes) gives
``quantize_activations``' q and scales bit for bit: per token and per group, int8 ties to even, e4m3, zero rows."""

from __future__ import annotations

import pytest
import torch
from infer_quant_w8a8.quantize import quantize_activations
from infer_quant_w8a8.schemes import ActivationFormat, QuantDtype


def _rows(x_dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 300, generator=g) * torch.tensor([1.0, 30.0, 1e-3, 1.0, 1.0])[:, None]
    x[3] = 0.0  # a row of zeros: the smallest scale, zeros out
    x[4, :4] = torch.tensor([254.0, 1.0, 3.0, 5.0])  # int8: scale 2, so 0.5, 1.5 and 2.5 are ties (to 0, 2, 2)
    x[4, 4:] = 0.0
    return x.to(x_dtype)


@pytest.mark.parametrize("dtype", list(QuantDtype))
@pytest.mark.parametrize("group_k", [None, 128])  # 128: two full groups and a tail of 44 columns
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_fused_quantization_equals_the_reference(device, dtype, group_k, x_dtype):
    from infer_quant_w8a8.act_quant import quantize_activations_fused

    fmt = ActivationFormat(dtype, group_k=group_k)
    x = _rows(x_dtype).to(device)
    q, scale = quantize_activations_fused(x, fmt)
    q_ref, scale_ref = quantize_activations(x, fmt)
    assert q.dtype == q_ref.dtype and q.shape == q_ref.shape == x.shape
    assert scale.shape == scale_ref.shape and torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.int8), q_ref.contiguous().view(torch.int8))  # the same bytes
    if dtype is QuantDtype.INT8 and group_k is None:
        assert q[4, :4].tolist() == [127, 0, 2, 2]


def test_a_static_format_is_refused(device):
    from infer_quant_w8a8.act_quant import quantize_activations_fused

    with pytest.raises(ValueError, match="static"):
        quantize_activations_fused(torch.zeros(2, 8, device=device), ActivationFormat(QuantDtype.INT8, static=True))


def nearest_e4m3(v: torch.Tensor) -> torch.Tensor:
    """float32 ``v`` (``|v| <= 448``) rounded to the nearest e4m3fn value, ties to the even encoding, in float64
    arithmetic over the type's 253 finite values: the definition, independent of any conversion routine."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes.view(torch.float8_e4m3fn).double()
    finite = torch.isfinite(values) & ~((values == 0) & (codes >= 128))  # one zero: +0
    values, codes = values[finite], codes[finite]
    values, order = values.sort()
    codes = codes[order]
    x = v.double().flatten()
    hi = torch.searchsorted(values, x).clamp(1, len(values) - 1)
    lo = hi - 1
    up = (values[hi] - x < x - values[lo]) | ((values[hi] - x == x - values[lo]) & (codes[hi] % 2 == 0))
    return torch.where(up, values[hi], values[lo]).float().view_as(v)


def test_nearest_e4m3_rounds_ties_to_even():
    assert nearest_e4m3(torch.tensor([0.0, 1.0625, 1.1875, -448.0, 2**-10, 3 * 2**-10])).tolist() == [
        0.0, 1.0, 1.25, -448.0, 0.0, 2**-8]


def test_the_reference_rounds_to_the_nearest_e4m3():
    x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16) * 3
    q, scale = quantize_activations(x, ActivationFormat(QuantDtype.FP8))
    assert torch.equal(q.float(), nearest_e4m3(x.float() / scale))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_the_gpu_kernel_equals_the_cpu_reference(dtype):
    """The scales on the GPU are the CPU's (a scale by division would be one ulp off on the GPU, where torch
    multiplies by the reciprocal of a Python divisor, on about half of these rows), and so are the int8 values;
    the e4m3 values are checked against the exact rounding of the CPU's quotients, not a torch conversion."""
    from infer_quant_w8a8.act_quant import quantize_activations_fused

    x = torch.randn(256, 4096, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16) * 3
    fmt = ActivationFormat(dtype)
    q, scale = quantize_activations_fused(x.cuda(), fmt)
    q_ref, scale_ref = quantize_activations(x, fmt)
    assert torch.equal(scale.cpu(), scale_ref)
    if dtype is QuantDtype.INT8:
        assert torch.equal(q.cpu(), q_ref)
    else:
        assert torch.equal(q.cpu().float(), nearest_e4m3(x.float() / scale_ref))
