"""The CPU's own GEMM kernels: AMX bfloat16 (``layers/cpu_amx.py``), each output the float32 sum rounded once,
whatever the row count (row halves, 32-row chunks, 256-row blocks), column count (tile pairs padded with zeros),
bias and row stride; AVX-512 float32 (``layers/cpu_f32_gemm.py``) within float32's summation error of the exact
sum; and where ``cpu_matmul`` sends each weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer_core.layers import cpu_amx, cpu_f32_gemm, cpu_matmul

amx = pytest.mark.skipif(cpu_amx.load() is None, reason="this CPU (or its kernel) gives no AMX bfloat16 tiles")
avx512 = pytest.mark.skipif(cpu_f32_gemm.load() is None, reason="this CPU (or its kernel) has no AVX-512F")


def _within_one_rounding(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None):
    exact = x.double() @ w.double().t() + (bias.double() if bias is not None else 0)
    # half a bfloat16 ulp of the exact value, plus float32's summation error over K terms
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    slack = (x.double().abs() @ w.double().abs().t()) * x.shape[1] * 2 ** -24
    err = (got.double() - exact).abs()
    assert (err <= ulp / 2 + slack).all(), f"worst {(err - ulp / 2 - slack).max().item():.3e} past one rounding"


@amx
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 32, 33, 300])
@pytest.mark.parametrize("n,k", [(16, 32), (40, 96), (96, 64)])
def test_amx_linear_is_the_sum_rounded_once(rows, n, k):
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    weight = (torch.randn(n, k, generator=gen) * 0.1).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    wide = torch.randn(rows, k + 48, generator=gen).bfloat16()
    x = wide[:, 16:16 + k]  # a row stride that is not K
    packed = cpu_amx.pack(weight)
    for b in (bias, None):
        got = cpu_amx.linear(x, packed, n, b)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        _within_one_rounding(got, x, weight, b)


@amx
def test_amx_keeps_nan_and_inf():
    weight = torch.ones(16, 32, dtype=torch.bfloat16)
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    x[0, 3], x[1, 5] = float("nan"), float("inf")
    got = cpu_amx.linear(x, cpu_amx.pack(weight), 16, None)
    assert got[0].isnan().all() and (got[1] == float("inf")).all()


@amx
def test_cpu_matmul_packs_bfloat16_into_tiles_and_runs_long_chunks_on_onednn():
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(48, 64, generator=gen) * 0.1).bfloat16()
    packed = cpu_matmul.pack(weight)
    assert packed.kind == "amx" and packed.weight.data_ptr() == weight.data_ptr()  # the plain weight, not a copy
    small = torch.randn(cpu_matmul.MAX_ROWS["amx"], 64, generator=gen).bfloat16()
    assert torch.equal(cpu_matmul.packed_linear(small, packed, None), cpu_amx.linear(small, packed.data, 48, None))
    large = torch.randn(cpu_matmul.MAX_ROWS["amx"] + 1, 64, generator=gen).bfloat16()
    assert torch.equal(cpu_matmul.packed_linear(large, packed, None), F.linear(large, weight))
    odd = cpu_matmul.pack(torch.randn(48, 80, generator=gen).bfloat16())  # K not a multiple of 32: oneDNN's layout
    assert odd.kind == "onednn"


@avx512
@pytest.mark.parametrize("rows", [1, 11, 12, 13, 25, 64])
@pytest.mark.parametrize("n,k", [(16, 7), (40, 64), (96, 33)])
def test_f32_linear_is_the_sum_within_float32_rounding(rows, n, k):
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    weight = torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    x = torch.randn(rows, k + 40, generator=gen)[:, 8:8 + k]  # a row stride that is not K
    packed = cpu_f32_gemm.pack(weight)
    for b in (bias, None):
        got = cpu_f32_gemm.linear(x, packed, n, b)
        assert got.shape == (rows, n)
        exact = x.double() @ weight.double().t() + (b.double() if b is not None else 0)
        bound = ((x.double().abs() @ weight.double().abs().t()) + 1) * (k + 1) * 2 ** -24
        assert ((got.double() - exact).abs() <= bound).all()


@avx512
def test_cpu_matmul_packs_float32_for_the_kernel_and_runs_long_chunks_on_onednn():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(40, 48, generator=gen)
    packed = cpu_matmul.pack(weight)
    assert packed.kind == "f32"
    small = torch.randn(cpu_matmul.MAX_ROWS["f32"], 48, generator=gen)
    assert torch.equal(cpu_matmul.packed_linear(small, packed, None), cpu_f32_gemm.linear(small, packed.data, 40, None))
    large = torch.randn(cpu_matmul.MAX_ROWS["f32"] + 1, 48, generator=gen)
    assert torch.equal(cpu_matmul.packed_linear(large, packed, None), F.linear(large, weight))


@pytest.mark.parametrize("dtype,kind,kernel", [("bfloat16", "amx", cpu_amx), ("float32", "f32", cpu_f32_gemm)])
def test_cpu_engine_runs_its_projections_on_our_kernels(tiny_checkpoint, dtype, kind, kernel):
    from infer_core import LLM

    if kernel.load() is None:
        pytest.skip(f"no {kind} kernel on this CPU")
    llm = LLM(str(tiny_checkpoint("qwen3")), device="cpu", dtype=dtype)
    try:
        model = llm.engine.executor.worker.runner.model
        packed = [m.method.packed for m in model.modules() if hasattr(m, "method")] + [model.lm_head.packed]
        assert packed and all(p is not None and p.kind == kind for p in packed)
    finally:
        llm.shutdown()
