"""The GEMV kernel against ``F.linear`` in float32 (the reference), in the interpreter on the CPU.

The kernel runs at every row count 1..8, at tiles that leave tails in N and K, and at the tiles
the heuristic picks; half-precision outputs must be within one step of the float32 result rounded
to their dtype (the kernel rounds once, after the bias; the interpreter truncates instead of rounding).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
import triton
from torch import nn

from infer_core.interfaces import ParallelContext
from infer_core.layers import fused
from infer_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from infer_core.layers.fused.dense import GEMV_MAX_ROWS, dense_linear, use_gemv
from infer_core.layers.fused.gemv import LARGE_K, MAX_ROWS, GemvConfig, choose_config, gemv, prefetch_lines
from infer_core.layers.unquantized import UnquantizedLinearMethod

# tails everywhere: N=37 leaves 5 of 16 (and 1 of 4) columns, K=45 leaves 13 of 16 and is no power of two
N, K = 37, 45
CONFIGS = {
    "heuristic": None,
    "fma-4x16": GemvConfig(block_n=4, block_k=16, num_warps=1, num_stages=3),
    "fma-8x64": GemvConfig(block_n=8, block_k=64, num_warps=2, num_stages=1),
    "fma-16x32": GemvConfig(block_n=16, block_k=32, num_warps=4, num_stages=2),
}

# (N, K) of every projection of Qwen3-0.6B, Qwen3-8B and Llama-3.1-8B: qkv, o, gate_up, down, LM head
REAL_SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151936, 1024),
               (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096),
               (28672, 4096), (4096, 14336), (128256, 4096),
               (3072, 4096), (4096, 2048), (4096, 6144), (75968, 4096)]  # Qwen3-8B as one rank of two holds it


def reference(x, w, b):
    return F.linear(x.float(), w.float(), None if b is None else b.float())


def inputs(num_rows: int, n: int, k: int, dtype: torch.dtype, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype)
    return x, w, b


@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_row_count_and_tile(num_rows, config, device, assert_close_to_reference):
    x, w, b = inputs(num_rows, N, K, torch.bfloat16, device, seed=num_rows)
    for bias in (b, None):
        y = gemv(x, w, bias, config=CONFIGS[config])
        assert y.shape == (num_rows, N) and y.dtype == torch.bfloat16
        assert_close_to_reference(y, reference(x, w, bias).to(torch.bfloat16), ulps=1)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_dtypes(config, dtype, device, assert_close_to_reference):
    x, w, b = inputs(5, N, K, dtype, device, seed=5)
    y = gemv(x, w, b, config=CONFIGS[config])
    assert y.dtype == dtype
    assert_close_to_reference(y, reference(x, w, b).to(dtype), ulps=1, fp32_tol=1e-5)


@pytest.mark.parametrize("config", ["heuristic", "fma-8x64", "fma-16x32"])
def test_longer_k_in_several_steps(config, device, assert_close_to_reference):
    """K=1000 in 16 steps of 64 (15 full, one tail of 40) and N=130 over several programs."""
    x, w, b = inputs(3, 130, 1000, torch.bfloat16, device, seed=3)
    assert_close_to_reference(gemv(x, w, b, config=CONFIGS[config]), reference(x, w, b).to(torch.bfloat16), ulps=1)


@pytest.mark.parametrize("config", ["heuristic", "fma-4x16", "fma-16x32"])
def test_strided_rows_and_leading_dims(config, device, assert_close_to_reference):
    cfg = CONFIGS[config]
    _, w, b = inputs(1, N, K, torch.bfloat16, device, seed=11)
    wide = torch.randn(6, K + 9, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    for x in (wide[:, 4:4 + K], wide[::2, :K], wide[:, :K].t().contiguous().t()):  # row stride K+9, 2(K+9), 1
        assert not x.is_contiguous()
        assert_close_to_reference(gemv(x, w, b, config=cfg), reference(x, w, b).to(torch.bfloat16), ulps=1)
    x3 = torch.randn(2, 3, K, generator=torch.Generator().manual_seed(2)).to(device, torch.bfloat16)
    y3 = gemv(x3, w, None, config=cfg)
    assert y3.shape == (2, 3, N)
    assert_close_to_reference(y3, reference(x3, w, None).to(torch.bfloat16), ulps=1)


def test_same_bits_every_call(device):
    x, w, b = inputs(4, N, K, torch.bfloat16, device, seed=4)
    for cfg in CONFIGS.values():
        assert torch.equal(gemv(x, w, b, config=cfg), gemv(x, w, b, config=cfg))


def test_empty_inputs(device):
    w = torch.randn(N, K).to(device, torch.bfloat16)
    assert gemv(torch.zeros(0, K, dtype=torch.bfloat16, device=device), w).shape == (0, N)
    b = torch.randn(3).to(device, torch.bfloat16)
    assert torch.equal(gemv(torch.zeros(2, 0, dtype=torch.bfloat16, device=device),
                            torch.zeros(3, 0, dtype=torch.bfloat16, device=device), b), b.expand(2, 3))


def test_bad_inputs_say_what_to_do(device):
    x, w, b = inputs(2, N, K, torch.bfloat16, device)
    with pytest.raises(ValueError, match="at most 8 rows"):
        gemv(torch.zeros(9, K, dtype=torch.bfloat16, device=device), w)
    with pytest.raises(ValueError, match="must be"):
        gemv(x, w[:, :-1])
    with pytest.raises(ValueError, match="convert"):
        gemv(x.float(), w)
    with pytest.raises(ValueError, match="contiguous"):
        gemv(x[:, :8], torch.randn(8, 3).to(device, torch.bfloat16).t())


@pytest.mark.parametrize("num_sms", [132, 114, 78])
def test_heuristic_fills_the_gpu_at_real_shapes(num_sms):
    """Each real shape: 2 programs an SM (>= 1 where 4-column tiles leave fewer), no K tail, tiles that fit."""
    for n, k in REAL_SHAPES:
        cfg = choose_config(n, k, 2, num_sms)
        programs = -(-n // cfg.block_n)
        assert programs >= min(2 * num_sms, n // 4) and programs >= num_sms, (n, k, cfg)
        assert k % cfg.block_k == 0, (n, k, cfg)
        large_k = k >= LARGE_K  # 8 x 1024 at 8 warps, one stage, from K=4096
        assert cfg.block_n * cfg.block_k * 2 <= 16 << 10
        assert cfg.block_n * cfg.block_k // (32 * cfg.num_warps) <= 64  # W values a thread a step
        assert cfg.num_stages == (1 if cfg.block_k >= k or large_k else 3), (n, k, cfg)
        if not large_k and k == triton.next_power_of_2(k) and 4 * k * 2 <= 16 << 10:
            assert cfg.block_k >= k, (n, k, cfg)  # all of K in one step where 4 columns hold it
    assert choose_config(1024, 3072, 2, 132) == GemvConfig(block_n=4, block_k=1024, num_warps=2, num_stages=3,
                                                           prefetch_steps=1)  # 0.6B down_proj: L2 prefetch
    assert choose_config(6144, 4096, 2, 132) == GemvConfig(block_n=8, block_k=1024, num_warps=8, num_stages=1)
    # one TP=2 rank's o_proj of Qwen3-8B: one step of 4 columns, not two of 8 (enough programs either way)
    assert choose_config(4096, 2048, 2, 132) == GemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1)
    assert choose_config(151936, 1024, 2, 132) == GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=1)
    # Qwen3-30B-A3B's o_proj: too few programs for 8 columns, so 4 take all of K=4096 in one step (32 KiB, 64 values
    # a thread at 8 warps), loaded before the PDL wait; any other K from 4096 keeps the large-K steps
    assert choose_config(2048, 4096, 2, 132) == GemvConfig(block_n=4, block_k=4096, num_warps=8, num_stages=1)
    assert choose_config(2048, 6144, 2, 132) == GemvConfig(block_n=4, block_k=2048, num_warps=8, num_stages=1)
    # K not a power of two: even steps, as before (one step would mask a quarter of its lanes)
    assert choose_config(1536, 1536, 2, 132) == GemvConfig(block_n=4, block_k=512, num_warps=1, num_stages=3,
                                                           prefetch_steps=1)


def test_prefetch_lines_only_with_pdl_and_several_k_steps():
    """How much of each W row a program asks L2 for before the PDL wait: its first prefetch_steps K steps
    (in 128-byte lines, a power of two), never past K, nothing without PDL or for a one-step tile."""
    large = choose_config(6144, 4096, 2, 132)  # 8 x 1024, four K steps
    assert large.block_k == 1024 and large.prefetch_steps == 0  # off by default: slower on the H100
    assert prefetch_lines(large, 4096, 2, pdl=True) == 0
    large = replace(large, prefetch_steps=1)
    assert prefetch_lines(large, 4096, 2, pdl=True) == 16  # 1024 bf16 = 2 KiB
    assert prefetch_lines(replace(large, prefetch_steps=2), 4096, 2, pdl=True) == 32
    assert prefetch_lines(replace(large, prefetch_steps=6), 4096, 2, pdl=True) == 64  # all of K, no more
    assert prefetch_lines(large, 4096, 2, pdl=False) == 0  # nothing to overlap: the kernel before has ended
    assert prefetch_lines(replace(large, prefetch_steps=0), 4096, 2, pdl=True) == 0
    one_step = choose_config(4096, 1024, 2, 132)  # loads its whole tile into registers before the wait instead
    assert one_step.block_k >= 1024 and prefetch_lines(one_step, 1024, 2, pdl=True) == 0
    assert prefetch_lines(GemvConfig(8, 256, 2, 3, prefetch_steps=1), 1000, 4, pdl=True) == 8  # float32: 1 KiB
    assert prefetch_lines(GemvConfig(8, 256, 2, 3, prefetch_steps=3), 1000, 2, pdl=True) == 16  # 1536 B -> 12 -> 16


def test_dispatch_limit_is_within_the_kernel():
    assert 1 <= GEMV_MAX_ROWS <= MAX_ROWS
    assert "gemv" in fused.OPS
    assert fused.GEMV is fused.FusedImpl.TRITON  # on by default (measured on the H100)


def test_linear_method_runs_f_linear_on_the_cpu():
    """Built on the CPU the method never runs the GEMV: ``apply`` is F.linear bit for bit, at every row count."""
    layer = nn.Module()
    method = UnquantizedLinearMethod()
    method.create_weights(layer, K, [N], torch.bfloat16)
    assert not method.gemv
    layer.weight.data.copy_(torch.randn(N, K))
    bias = torch.randn(N).to(torch.bfloat16)
    for num_rows in (1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1):
        x = torch.randn(num_rows, K).to(torch.bfloat16)
        assert torch.equal(method.apply(layer, x, bias), F.linear(x, layer.weight, bias))
        assert torch.equal(dense_linear(x, layer.weight, None, False), F.linear(x, layer.weight))


@pytest.mark.parametrize("tied", [False, True])
def test_lm_head_is_f_linear_on_the_cpu(tied):
    """The LM head goes through the same dispatch: on the CPU, F.linear of its (possibly tied) weight."""
    parallel = ParallelContext.single()
    embed = VocabParallelEmbedding(N, K, parallel=parallel, dtype=torch.bfloat16)
    embed.weight.data.copy_(torch.randn(N, K))
    head = ParallelLMHead(N, K, parallel=parallel, dtype=torch.bfloat16, tied_to=embed if tied else None)
    if not tied:
        head.weight.data.copy_(torch.randn(N, K))
    hidden = torch.randn(2, K).to(torch.bfloat16)
    assert torch.equal(head(hidden), F.linear(hidden, head.weight))


def test_after_rms_norm_tiles_run_at_the_norms_warps(device, assert_close_to_reference):
    """x from an RMSNorm: the tiles of config_after_rms_norm (the norm kernel's warps), the same product."""
    from infer_core.layers.fused.gemv import config_after_rms_norm, num_sms, rms_norm_warps
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS, _tiles

    for k in (45, 1024, 2048, 4096, 5120, MAX_SINGLE_PASS):
        assert rms_norm_warps(k) == _tiles(k, MAX_SINGLE_PASS)[3]
        assert config_after_rms_norm(4096, k, 2, 132).num_warps == rms_norm_warps(k)
    assert rms_norm_warps(MAX_SINGLE_PASS + 1) is None  # two-pass norms are never fused: the plain tiles
    assert config_after_rms_norm(64, MAX_SINGLE_PASS + 1, 2, 132) == choose_config(64, MAX_SINGLE_PASS + 1, 2, 132)
    x, w, b = inputs(2, N, K, torch.bfloat16, device, seed=9)
    y = gemv(x, w, b, after_rms_norm=True)
    assert torch.equal(y, gemv(x, w, b, config=config_after_rms_norm(N, K, 2, num_sms(x.device))))
    assert_close_to_reference(y, reference(x, w, b).to(torch.bfloat16), ulps=1)


def test_gemv_on_the_cpu_where_built_for_it(triton_on_cpu):
    """Built for our kernels on the CPU (the interpreter; tests of the fused decode path) the method runs the GEMV
    up to GEMV_MAX_ROWS rows, with the tiles of a GEMV after a norm where its layer's input is one."""
    layer = nn.Module()
    method = UnquantizedLinearMethod()
    method.create_weights(layer, K, [N], torch.bfloat16)
    layer.weight.data.copy_(torch.randn(N, K))
    x = torch.randn(GEMV_MAX_ROWS + 1, K).to(torch.bfloat16)
    assert method.gemv and not method.after_rms_norm
    assert use_gemv(x[:GEMV_MAX_ROWS], layer.weight) and not use_gemv(x, layer.weight)
    assert not use_gemv(x[:1].float(), layer.weight)  # a dtype the kernel is not used for
    assert torch.equal(method.apply(layer, x[:1], None), gemv(x[:1], layer.weight))
    assert torch.equal(method.apply(layer, x, None), F.linear(x, layer.weight))
    after_norm = nn.Module()
    after_norm.after_rms_norm = True
    normed_method = UnquantizedLinearMethod()
    normed_method.create_weights(after_norm, K, [N], torch.bfloat16)
    after_norm.weight.data.copy_(layer.weight)
    assert normed_method.after_rms_norm and not normed_method.before_silu
    assert torch.equal(normed_method.apply(after_norm, x[:2], None), gemv(x[:2], layer.weight, after_rms_norm=True))
