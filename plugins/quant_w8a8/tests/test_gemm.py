"""The GEMM paths (``torch._scaled_mm``, ``torch._int_mm``; both also run on the CPU) and the GEMV path through a
linear layer, against the reference W8A8 product."""

from __future__ import annotations

import pytest
import torch
from infer_core.interfaces import ParallelContext
from infer_core.layers import fused
from infer_core.layers.linear import QKVParallelLinear
from infer_quant_w8a8.gemm import choose_gemm, fp8_scaled_mm, int8_int_mm, reference
from infer_quant_w8a8.linear_method import W8A8LinearMethod
from infer_quant_w8a8.quantize import dequantize_weight, quantize_weight, reference_linear
from infer_quant_w8a8.schemes import ActivationFormat, LinearScheme, QuantDtype, WeightFormat, online_scheme


def _operands(rows, n, k, scheme, device, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(rows + n + k)
    wq, scale = quantize_weight(torch.randn(n, k, generator=g), scheme.weight)
    x = torch.randn(rows, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    return [t.to(device) for t in (x, wq, scale, bias)]


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("rows", [3, 20])  # _int_mm's padded rows, and more than 16
def test_int8_int_mm_is_the_reference(rows, static):
    scheme = LinearScheme(WeightFormat(QuantDtype.INT8), ActivationFormat(QuantDtype.INT8, static=static))
    x, wq, scale, bias = _operands(rows, 32, 64, scheme, "cpu")
    input_scale = torch.tensor([0.02]) if static else None
    got = int8_int_mm(x, wq, scale, scheme, bias, input_scale)
    expected = reference_linear(x, wq, scale, scheme, bias, input_scale)
    # the same int32 sums and scales; bias added in float32 before the one rounding in both
    assert torch.equal(got, expected)


def _cpu_scaled_mm_takes_row_scales() -> bool:
    one = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(one, one.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


@pytest.mark.skipif(not _cpu_scaled_mm_takes_row_scales(), reason="this torch's CPU _scaled_mm takes per-tensor "
                    "scales only (the GPU image's 2.11; CI's 2.13 takes rows)")
def test_fp8_scaled_mm_is_the_reference():
    scheme = online_scheme(QuantDtype.FP8)
    x, wq, scale, bias = _operands(5, 32, 64, scheme, "cpu")
    got = fp8_scaled_mm(x, wq, scale, scheme, bias, None)
    # the bfloat16 bias in _scaled_mm's float32 epilogue: one rounding, as the reference (float32 sums on the CPU)
    assert torch.equal(got, reference_linear(x, wq, scale, scheme, bias))
    x16, bias16 = x.half(), bias.half()  # a float16 model: its bias after _scaled_mm's bfloat16 output
    got = fp8_scaled_mm(x16, wq, scale, scheme, bias16, None)
    product = fp8_scaled_mm(x16, wq, scale, scheme, None, None).float()
    assert got.dtype == torch.float16
    assert torch.equal(got, (product + bias16.float()).half())


def test_kernels_are_chosen_by_device_and_shape():
    int8, fp8 = online_scheme(QuantDtype.INT8), online_scheme(QuantDtype.FP8)
    block = LinearScheme(WeightFormat(QuantDtype.FP8, 128), ActivationFormat(QuantDtype.FP8, group_k=128), True)
    cuda = torch.device("cuda")
    assert choose_gemm(int8, 64, 64, torch.device("cpu")) is reference
    assert choose_gemm(int8, 64, 64, cuda) is int8_int_mm and choose_gemm(int8, 60, 64, cuda) is reference
    assert choose_gemm(fp8, 64, 64, cuda) is fp8_scaled_mm and choose_gemm(fp8, 64, 72, cuda) is reference
    assert choose_gemm(block, 256, 256, cuda) is reference  # no block-scaled GPU GEMM yet


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the Triton GEMV on CPU tensors, under the interpreter")
@pytest.mark.parametrize("dtype", list(QuantDtype))
def test_a_fused_layer_runs_the_gemv_at_one_row_and_the_gemm_above(monkeypatch, dtype):
    """A QKV layer built where Triton runs (the CPU under the interpreter) loads q, k and v and picks the GEMV for
    a decode row: the dequantized product, unrounded activations; more rows: the W8A8 reference."""
    monkeypatch.setattr(fused, "TRITON_DEVICES", ("cuda", "cpu"))
    layer = QKVParallelLinear(64, 16, 4, 2, bias=False, method=W8A8LinearMethod(online_scheme(dtype)),
                              parallel=ParallelContext.single(), dtype=torch.float32, prefix="model.layers.0.qkv_proj")
    assert layer.method.gemv
    g = torch.Generator().manual_seed(7)
    shards = {"q": torch.randn(64, 64, generator=g), "k": torch.randn(32, 64, generator=g),
              "v": torch.randn(32, 64, generator=g)}
    for shard, tensor in shards.items():
        layer.weight_loader(layer.weight, tensor, shard)
    whole = torch.cat(list(shards.values()))
    wq, scale = quantize_weight(whole, layer.method.scheme.weight)  # per row: the same fused or not
    assert torch.equal(layer.weight.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(layer.weight_scale, scale)
    x = torch.randn(3, 64, generator=g)
    one = layer(x[:1])
    torch.testing.assert_close(one.double(), x[:1].double() @ dequantize_weight(wq, scale).double().T,
                               rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(layer.method, "gemv", False)  # the same rows through the GEMM path
    assert torch.equal(layer(x), reference_linear(x, wq, scale, layer.method.scheme))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(QuantDtype))
@pytest.mark.parametrize("rows", [1, 5, 16, 100])
def test_cuda_linear_paths_at_qwen3_8b_shapes(dtype, rows):
    """On the GPU: what the layer's chosen path returns (GEMV up to 8 rows, the GEMMs above) against the
    reference W8A8 (from 9 rows) or the dequantized product (the GEMV's W8A16), on the same device."""
    scheme = online_scheme(dtype)
    x, wq, scale, bias = _operands(rows, 6144, 4096, scheme, "cuda")
    method = W8A8LinearMethod(scheme)
    layer = torch.nn.Module()
    with torch.device("cuda"):
        method.create_weights(layer, 4096, [6144], torch.bfloat16)
    layer.weight.data.copy_(wq)
    layer.weight_scale.copy_(scale)
    got = method.apply(layer, x, bias).float()
    if rows <= 8:
        expected = (x.double() @ dequantize_weight(wq, scale).double().T + bias.double()).float()
    else:
        expected = reference_linear(x, wq, scale, scheme, bias).float()
    single_rounding = 2e-2 + 2**-7 * expected.abs()
    if rows <= 8 or dtype is QuantDtype.INT8:  # float32 sums (GEMV), exact int32 sums (_int_mm): one rounding apart
        assert bool(((got - expected).abs() <= single_rounding).all())
        return
    # _scaled_mm on the FP8 tensor cores: each MMA aligns its 32 products and the partial sum to the largest
    # exponent and keeps about 14 bits, so its sums are not float32's. benchmarks/fp8_accumulation.py emulates
    # that on these operands: at 14 bits it puts 2 of 24,576 outputs past the single-rounding bound (the H100:
    # 9 of 98,304 and 61 of 614,400), with an accumulation error of 0.0079 rms and 0.040 at most (13 bits: 148
    # outputs, 0.020 rms). Hence: every output within the bound plus 2**-4 (8 x that rms; the H100's largest
    # difference was 0.0625 = 0.040 + one bfloat16 ulp at |y| ~ 5), and at most 0.1% of them past the single
    # rounding bound (a wrong scale or rounding misses nearly all of them).
    assert bool(((got - expected).abs() <= single_rounding + 2**-4).all())
    assert int(((got - expected).abs() > single_rounding).sum()) <= expected.numel() // 1000
