"""The W8 GEMV with its input RMSNorm (+ residual add) in one launch against the core's norm kernel then the W8
GEMV, in Triton's interpreter on the CPU (and at a Qwen3-8B shape on a GPU, ``-m gpu``).

The stored residual sum and the norm's output must be the norm kernel's bits (torch.equal). The output is the
plain GEMV's on that norm output up to the order of its float32 sums: bit for bit in the interpreter (the same
tiles sum in the same order whatever the warp count), within one rounding on a GPU (the fused launch runs at
the norm kernel's warp count, which may lay the GEMV's tile out otherwise).
"""

from __future__ import annotations

import os

import pytest
import torch
from infer_quant_w8a8.quantize import quantize_weight
from infer_quant_w8a8.schemes import QuantDtype, WeightFormat

EPS = 1e-6
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def make_inputs(rows: int, n: int, k: int, dtype: QuantDtype, group_k: int | None, x_dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    wq, scale = quantize_weight(torch.randn(n, k, generator=gen) / k**0.5, WeightFormat(dtype, group_k))
    x = (torch.randn(rows, k, generator=gen) * 2).to(x_dtype)
    residual = torch.randn(rows, k, generator=gen).to(x_dtype)
    norm_weight = (1 + 0.2 * torch.randn(k, generator=gen)).to(x_dtype)
    bias = torch.randn(n, generator=gen).to(x_dtype)
    return [t.to(device) for t in (x, residual, norm_weight, wq, scale, bias)]


def within_one_rounding(got: torch.Tensor, want: torch.Tensor, gate: torch.Tensor | None = None) -> bool:
    """Equal in the interpreter; on a GPU within a step of the dtype at |want| (sums in another order round to
    the neighbouring value at most), and with SiLU-and-mul, whose ``gate`` a step off moves silu(gate) * up by up
    to |gate| steps, within 4 + |gate| steps (as ``test_gemv.py`` allows)."""
    if INTERPRETED:
        return torch.equal(got, want)
    steps = 1 if gate is None else 4 + gate.double().abs()
    bound = torch.finfo(want.dtype).eps * want.double().abs() * steps + 1e-3
    return bool(((got.double() - want.double()).abs() <= bound).all())


def gate_of(normed, wq, scale, bias, group_k, silu):
    """The gate half of the plain GEMV's output (None without SiLU-and-mul)."""
    from infer_quant_w8a8.gemv import w8_gemv

    return w8_gemv(normed, wq, scale, bias, group_k)[..., : wq.shape[0] // 2] if silu else None


# K=80: a masked K tail and a norm tile wider than the row; N=36 a partial column block (of 18 gate/up pairs);
# 3 rows padded to 4 (a repeat); groups of 16, and of 128 at K=256 (several K steps after the preloaded first);
# 8 rows, the most the GEMV takes
CASES = [(36, 80, 1, None), (32, 64, 3, 16), (256, 256, 2, 128), (40, 48, 8, None)]


@pytest.mark.parametrize("silu", [False, True], ids=["gemv", "gemv-silu"])
@pytest.mark.parametrize("dtype", list(QuantDtype))
@pytest.mark.parametrize("n, k, rows, group_k", CASES)
def test_fused_norm_equals_the_norm_kernel_then_the_gemv(device, dtype, n, k, rows, group_k, silu):
    from infer_core.layers.fused.rms_norm import rms_norm
    from infer_quant_w8a8.gemv import w8_gemv, w8_rms_norm_gemv

    x, residual, norm_weight, wq, scale, bias = make_inputs(rows, n, k, dtype, group_k, torch.bfloat16, device,
                                                            seed=n + k + rows)
    residual_before = residual.clone()
    for res in (residual, None):  # None: the first layer, whose input is the embedding
        for b in (bias, None):
            normed_out = torch.full_like(x, float("nan"))
            got = w8_rms_norm_gemv(x, norm_weight, EPS, wq, scale, b, group_k, res, silu=silu, normed_out=normed_out)
            want_normed = rms_norm(x, norm_weight, EPS, res)
            if res is not None:
                (got, got_sum), (want_normed, want_sum) = got, want_normed
                assert torch.equal(got_sum, want_sum)
            assert torch.equal(normed_out, want_normed)
            want = w8_gemv(want_normed, wq, scale, b, group_k, silu=silu)
            assert got.shape == want.shape == (rows, n // 2 if silu else n)
            assert within_one_rounding(got, want, gate_of(want_normed, wq, scale, b, group_k, silu))
    assert torch.equal(residual, residual_before)


@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_float32_rows_and_the_residual_into_a_given_tensor(device, dtype):
    """A float32 model (the norm's roundings are exact there), the sum into the tensor the norm handed on."""
    from infer_core.layers.fused.rms_norm import rms_norm
    from infer_quant_w8a8.gemv import w8_gemv, w8_rms_norm_gemv

    x, residual, norm_weight, wq, scale, bias = make_inputs(2, 40, 96, dtype, None, torch.float32, device)
    residual_out = torch.empty_like(x)
    got, summed = w8_rms_norm_gemv(x, norm_weight, EPS, wq, scale, bias, None, residual, residual_out=residual_out)
    want_normed, want_sum = rms_norm(x, norm_weight, EPS, residual)
    assert summed is residual_out and torch.equal(summed, want_sum)
    torch.testing.assert_close(got, w8_gemv(want_normed, wq, scale, bias), rtol=1e-6, atol=1e-6)


def test_refuses_what_does_not_fit(device):
    from infer_quant_w8a8.gemv import w8_rms_norm_gemv

    x, residual, norm_weight, wq, scale, _ = make_inputs(1, 32, 64, QuantDtype.INT8, None, torch.bfloat16, device)
    with pytest.raises(ValueError, match="norm weight"):
        w8_rms_norm_gemv(x, norm_weight.float(), EPS, wq, scale)
    with pytest.raises(ValueError, match="normed_out"):
        w8_rms_norm_gemv(x, norm_weight, EPS, wq, scale, normed_out=torch.empty(1, 32, dtype=x.dtype, device=device))
    with pytest.raises(ValueError, match="residual"):
        w8_rms_norm_gemv(x, norm_weight, EPS, wq, scale, residual=residual.float())
    with pytest.raises(ValueError, match="at most 8 rows"):
        w8_rms_norm_gemv(x.expand(9, 64), norm_weight, EPS, wq, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_fused_norm_on_the_gpu_at_qwen3_8b_shapes(dtype):
    """qkv (6144 x 4096) per channel and gate_up (2 x 12288 x 4096, SiLU-and-mul) in 128 x 128 blocks, 1 and 2
    rows: the norm's bits, and the GEMV's within one rounding."""
    from infer_core.layers.fused.rms_norm import rms_norm
    from infer_quant_w8a8.gemv import w8_gemv, w8_rms_norm_gemv

    for n, group_k, silu in ((6144, None, False), (24576, 128, True), (6144, 128, False), (24576, None, True)):
        for rows in (1, 2):
            x, residual, norm_weight, wq, scale, bias = make_inputs(rows, n, 4096, dtype, group_k, torch.bfloat16,
                                                                    "cuda", seed=rows)
            normed_out = torch.empty_like(x)
            got, got_sum = w8_rms_norm_gemv(x, norm_weight, EPS, wq, scale, None, group_k, residual, silu=silu,
                                            normed_out=normed_out)
            want_normed, want_sum = rms_norm(x, norm_weight, EPS, residual)
            assert torch.equal(got_sum, want_sum) and torch.equal(normed_out, want_normed)
            want = w8_gemv(want_normed, wq, scale, None, group_k, silu=silu)
            assert within_one_rounding(got, want, gate_of(want_normed, wq, scale, None, group_k, silu))
