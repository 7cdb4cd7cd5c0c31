"""The input norm and the per-token activation quantization in one launch (``norm_quant.rms_norm_quantize``): the
core's norm kernel then ``act_quant``'s launch, bit for bit (q, scales, the residual sum, the normalised rows),
in Triton's interpreter on the CPU at small shapes (on a GPU at Qwen3-8B's width too)."""

from __future__ import annotations

import pytest
import torch
from infer_core.layers.fused.rms_norm import rms_norm

from infer_quant_w8a8.schemes import ActivationFormat, QuantDtype


def _inputs(device, num_rows, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(num_rows, k, generator=gen) * 3).to(torch.bfloat16)
    x[:, 7] = 40.0  # an outlier channel, as real activations have
    residual = torch.randn(num_rows, k, generator=gen).to(torch.bfloat16)
    weight = (1 + 0.3 * torch.randn(k, generator=gen)).to(torch.bfloat16)
    return x.to(device), residual.to(device), weight.to(device)


@pytest.mark.parametrize("dtype", list(QuantDtype))
@pytest.mark.parametrize("num_rows,k", [(1, 64), (3, 576), (9, 96), (20, 64)])
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "no-residual"])
def test_equals_the_norm_then_the_quantization(device, dtype, num_rows, k, with_residual):
    from infer_quant_w8a8.act_quant import quantize_activations_fused
    from infer_quant_w8a8.norm_quant import rms_norm_quantize

    x, residual, weight = _inputs(device, num_rows, k)
    fmt = ActivationFormat(dtype)
    if with_residual:
        want_normed, want_sum = rms_norm(x, weight, 1e-6, residual)
        got_sum = torch.full_like(x, float("nan"))
    else:
        want_normed, want_sum, residual, got_sum = rms_norm(x, weight, 1e-6), None, None, None
    want_q, want_scale = quantize_activations_fused(want_normed, fmt)
    got_normed = torch.full_like(x, float("nan"))
    q, scale = rms_norm_quantize(x, weight, 1e-6, fmt, residual, got_sum, got_normed)
    assert q.dtype == want_q.dtype and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)
    assert torch.equal(got_normed, want_normed)
    if with_residual:
        assert torch.equal(got_sum, want_sum)
    q_alone, _ = rms_norm_quantize(x, weight, 1e-6, fmt, residual, torch.empty_like(x))  # nothing kept
    assert torch.equal(q_alone.view(torch.uint8), q.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_equals_the_two_launches_at_qwen3_8b_width(dtype):
    """Qwen3-8B's hidden size, 256 rows: one row a program at 8 warps, the norm kernel's tile."""
    test_equals_the_norm_then_the_quantization("cuda", dtype, 256, 4096, True)


def test_bad_input_is_refused(device):
    from infer_quant_w8a8.norm_quant import rms_norm_quantize

    x, residual, weight = _inputs(device, 2, 64)
    with pytest.raises(ValueError, match="per token and dynamically"):
        rms_norm_quantize(x, weight, 1e-6, ActivationFormat(QuantDtype.INT8, group_k=32))
    with pytest.raises(ValueError, match="residual_out"):
        rms_norm_quantize(x, weight, 1e-6, ActivationFormat(QuantDtype.INT8), residual)
    with pytest.raises(ValueError, match="norm weight"):
        rms_norm_quantize(x, weight.float(), 1e-6, ActivationFormat(QuantDtype.INT8))
