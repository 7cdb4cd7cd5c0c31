"""The fused norm + GEMV (+ SiLU-and-mul) launch against the separate kernels, in the interpreter on the CPU.

The reference is what the decoder layer runs unfused: ``rms_norm`` then ``gemv`` (with the same tiles)
then ``silu_and_mul``, each our Triton kernel; every result must be equal bit for bit (torch.equal).
Shapes leave tails everywhere: N not a multiple of the columns a program owns, K not a multiple of the
K tile (or no power of two, so one-step tiles are masked), and K > 1024 where rms_norm's tile holds one
row, so the fused launch normalises two rows in two blocks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from infer_core.layers.fused.gemv import GemvConfig, config_after_rms_norm, gemv, num_sms
from infer_core.layers.fused.norm_gemv import gemv_silu_and_mul, rms_norm_gemv
from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.layers.fused.silu_and_mul import silu_and_mul

EPS = 1e-6
# (N, K): N=74 leaves 10 of 16 columns (5 of 8 gate/up pairs), K=45 leaves 13 of 16; K=1100 is one row a norm tile
SHAPES = [(74, 45), (38, 1100)]
CONFIGS = {
    "after-norm": None,  # config_after_rms_norm: one K step at these K (masked: no power of two)
    "4x16-s3": GemvConfig(block_n=4, block_k=16, num_warps=2, num_stages=3),  # several K steps, a tail
    "16x32-s2": GemvConfig(block_n=16, block_k=32, num_warps=2, num_stages=2),
}


def make_inputs(num_rows: int, n: int, k: int, dtype: torch.dtype, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(num_rows, k, generator=gen) * 2).to(device, dtype)
    residual = torch.randn(num_rows, k, generator=gen).to(device, dtype)
    norm_weight = (1 + 0.2 * torch.randn(k, generator=gen)).to(device, dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    bias = torch.randn(n, generator=gen).to(device, dtype)
    return x, residual, norm_weight, weight, bias


def separate(x, residual, norm_weight, weight, bias, config, silu):
    """rms_norm -> gemv -> silu_and_mul, as the decoder layer runs them unfused."""
    normed = rms_norm(x, norm_weight, EPS, residual)
    normed, summed = normed if residual is not None else (normed, None)
    y = gemv(normed, weight, bias, config=config, after_rms_norm=True, before_silu=silu)
    return (silu_and_mul(y) if silu else y), summed


@pytest.mark.parametrize("silu", [False, True], ids=["gemv", "gemv-silu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_rows", [1, 2])
@pytest.mark.parametrize("n,k", SHAPES)
def test_norm_gemv_equals_the_separate_kernels(n, k, num_rows, dtype, silu, device):
    x, residual, norm_weight, weight, bias = make_inputs(num_rows, n, k, dtype, device, seed=n + k + num_rows)
    residual_before = residual.clone()
    for res in (residual, None):  # None: the first layer, whose input is the embedding
        for b in (bias, None):
            got = rms_norm_gemv(x, norm_weight, EPS, weight, b, res, silu=silu)
            want, want_sum = separate(x, res, norm_weight, weight, b, None, silu)
            if res is None:
                assert torch.equal(got, want)
            else:
                got, got_sum = got
                assert torch.equal(got, want) and torch.equal(got_sum, want_sum)
                assert got_sum.data_ptr() not in (x.data_ptr(), residual.data_ptr())  # a new tensor
            assert got.shape == (num_rows, n // 2 if silu else n) and got.dtype == dtype
    assert torch.equal(residual, residual_before)  # other programs read the old residual: never written


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("num_rows", [1, 2, 3])
def test_tiles_with_several_k_steps_and_padded_rows(config, num_rows, device):
    """bfloat16 with bias and residual at explicit tiles (K steps with a tail); 3 rows pad to 4 (one repeated)."""
    n, k = SHAPES[0]
    cfg = CONFIGS[config]
    x, residual, norm_weight, weight, bias = make_inputs(num_rows, n, k, torch.bfloat16, device, seed=num_rows)
    for silu in (False, True):
        got, got_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu, config=cfg)
        want, want_sum = separate(x, residual, norm_weight, weight, bias, cfg, silu)
        assert torch.equal(got, want) and torch.equal(got_sum, want_sum)


@pytest.mark.parametrize("num_rows", [1, 3])
def test_persistent_launch_changes_no_bit(num_rows, device):
    """``programs_per_sm``: fewer programs than column blocks, each walking several of them after one norm
    prologue; every block's sums are those of the launch of one program a block."""
    n, k = SHAPES[0]
    cfg = CONFIGS["4x16-s3"]
    x, residual, norm_weight, weight, bias = make_inputs(num_rows, n, k, torch.bfloat16, device, seed=11)
    for silu in (False, True):  # 19 and 10 blocks of 4 columns over a handful of programs
        want, want_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu, config=cfg)
        for programs_per_sm in (1, 2):
            got, got_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu,
                                         config=replace(cfg, programs_per_sm=programs_per_sm))
            assert torch.equal(got, want) and torch.equal(got_sum, want_sum)


@pytest.mark.parametrize("silu", [False, True], ids=["gemv", "gemv-silu"])
def test_sum_into_a_given_tensor(silu, device):
    """``residual_out``: the sum ``x + residual`` is written there, the output is the same."""
    x, residual, norm_weight, weight, bias = make_inputs(2, 64, 48, torch.bfloat16, device, seed=5)
    want, want_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu)
    residual_out = torch.empty_like(x)
    got, got_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu, residual_out=residual_out)
    assert got_sum is residual_out and torch.equal(got_sum, want_sum) and torch.equal(got, want)
    with pytest.raises(ValueError, match="residual_out"):
        rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu, residual_out=residual_out.float())


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("num_rows", [1, 3])
def test_the_normed_rows_stored_as_the_norm_kernel_gives_them(config, num_rows, device):
    """``normed_out`` (an MoE block's router, whose experts read the norm's output after it): filled with
    ``rms_norm``'s output bit for bit, by one, several or persistent K steps; the GEMV's output is unchanged."""
    n, k = SHAPES[1] if config == "after-norm" else SHAPES[0]  # 1100: the norm's rows in two blocks
    cfg = CONFIGS[config] if config != "4x16-s3" else replace(CONFIGS[config], programs_per_sm=1)
    x, residual, norm_weight, weight, bias = make_inputs(num_rows, n, k, torch.bfloat16, device, seed=7)
    for res in (residual, None):
        want = rms_norm_gemv(x, norm_weight, EPS, weight, bias, res, config=cfg)
        normed = torch.full_like(x, float("nan"))
        got = rms_norm_gemv(x, norm_weight, EPS, weight, bias, res, config=cfg, normed_out=normed)
        want_normed = rms_norm(x, norm_weight, EPS, res)
        if res is not None:
            (got, got_sum), (want, want_sum), want_normed = got, want, want_normed[0]
            assert torch.equal(got_sum, want_sum)
        assert torch.equal(got, want) and torch.equal(normed, want_normed)
    with pytest.raises(ValueError, match="normed_out"):
        rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, normed_out=normed[:, :-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("num_rows", [1, 2])
def test_gemv_silu_and_mul_equals_the_two_launches(num_rows, dtype, device):
    n, k = SHAPES[0]
    x, _, _, weight, bias = make_inputs(num_rows, n, k, dtype, device, seed=7)
    for b in (bias, None):
        for cfg in (None, CONFIGS["4x16-s3"]):
            want = silu_and_mul(gemv(x, weight, b, config=cfg))
            assert torch.equal(gemv_silu_and_mul(x, weight, b, config=cfg), want)


def test_close_to_float64(device):
    """Not only equal to the separate kernels: the result is the norm, matmul and SiLU it claims to be."""
    n, k = SHAPES[1]
    x, residual, norm_weight, weight, bias = make_inputs(2, n, k, torch.float32, device, seed=3)
    summed = (x + residual).double()
    normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + EPS) * norm_weight.double()
    gate, up = F.linear(normed, weight.double(), bias.double()).chunk(2, dim=-1)
    got, got_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=True)
    torch.testing.assert_close(got.double(), F.silu(gate) * up, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_sum.double(), summed)


def test_strided_rows(device):
    """x and the residual as views with a row stride past K (rows of a wider buffer)."""
    n, k = SHAPES[0]
    _, _, norm_weight, weight, bias = make_inputs(2, n, k, torch.bfloat16, device)
    wide = torch.randn(2, 2 * k + 3, generator=torch.Generator().manual_seed(5)).to(device, torch.bfloat16)
    x, residual = wide[:, :k], wide[:, k + 3:]
    got, got_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual)
    want, want_sum = separate(x, residual, norm_weight, weight, bias, None, False)
    assert torch.equal(got, want) and torch.equal(got_sum, want_sum)


def test_large_k_tiles_in_several_steps_with_a_tail(device):
    """K=4100 after a norm: the large-K tiles at 8 warps in 17 K steps of 256, the last masked to 4 elements."""
    n, k = 24, 4100
    for silu in (False, True):
        cfg = config_after_rms_norm(n, k, 2, num_sms(torch.device(device)), silu=silu)
        assert cfg.num_warps == 8 and cfg.block_k == 256 and k % cfg.block_k, cfg
    x, residual, norm_weight, weight, bias = make_inputs(2, n, k, torch.bfloat16, device, seed=41)
    for silu in (False, True):
        got, got_sum = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu)
        want, want_sum = separate(x, residual, norm_weight, weight, bias, None, silu)
        assert torch.equal(got, want) and torch.equal(got_sum, want_sum)


def test_one_k_step_at_the_norms_warps():
    """After a norm the GEMV runs at rms_norm's warp count, one K step where 4+ columns leave room for it
    (Qwen3-8B's qkv at K=4096 too: 4 columns at 8 warps); else from K=4096 (8 warps) the large-K tiles: 8 columns
    in two or more steps, unpipelined, persistent when fused; a gate_up followed by SiLU-and-mul (``silu``) is
    never one step where the norm runs at 8 warps (rows over 1024) and halves the step, as its fused program
    loads gate and up."""
    for n, k, warps, one_step in [(4096, 1024, 2, True), (6144, 1024, 2, True), (6144, 4096, 8, True),
                                  (3072, 4096, 8, True), (24576, 4096, 8, True), (6144, 5120, 8, False),
                                  (12288, 2048, 8, True), (5120, 2048, 8, True), (1536, 1536, 8, True),
                                  (17920, 1536, 8, True)]:
        for silu in (False, True):
            cfg = config_after_rms_norm(n, k, 2, 132, silu=silu)
            large = warps == 8
            one = one_step and not (silu and large)
            assert cfg.num_warps == warps, (n, k, cfg)
            assert (cfg.block_k >= k) == one, (n, k, cfg)
            assert (cfg.num_stages == 1) == (one or large), (n, k, cfg)
            tiles = 2 if silu and large else 1  # at 2 warps, silu leaves the tiles alone
            assert tiles * cfg.block_n * cfg.block_k <= 64 * 32 * warps, (n, k, cfg)  # 64 W values a thread
            if k >= 4096 and one:
                assert cfg.block_n == 4 and cfg.programs_per_sm == 0, cfg  # a program a block: one tile to load
            elif not one:
                block_k = 1024 if silu else 2048
                while k % block_k:
                    block_k //= 2
                assert cfg.block_n == (8 if n // 8 >= 2 * 132 else 4) and cfg.block_k == block_k, cfg
                assert cfg.programs_per_sm > 0, cfg
    assert num_sms(torch.device("cpu")) >= 1


def test_empty_and_bad_inputs(device):
    n, k = SHAPES[0]
    x, residual, norm_weight, weight, bias = make_inputs(2, n, k, torch.bfloat16, device)
    y, summed = rms_norm_gemv(x[:0], norm_weight, EPS, weight, bias, residual[:0])
    assert y.shape == (0, n) and summed.shape == (0, k)
    with pytest.raises(ValueError, match="must be"):
        rms_norm_gemv(x, norm_weight[:-1], EPS, weight)
    with pytest.raises(ValueError, match="must be"):
        rms_norm_gemv(x, norm_weight, EPS, weight[:, :-1])
    with pytest.raises(ValueError, match="convert"):
        rms_norm_gemv(x, norm_weight.float(), EPS, weight)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_gemv(x, norm_weight, EPS, weight, None, residual[:1])
    with pytest.raises(ValueError, match="even"):
        rms_norm_gemv(x, norm_weight, EPS, weight[:-1], silu=True)
    with pytest.raises(ValueError, match="at most 8 rows"):
        rms_norm_gemv(torch.zeros(9, k, dtype=torch.bfloat16, device=device), norm_weight, EPS, weight)
    with pytest.raises(ValueError, match="at most 16384"):
        big = torch.zeros(1, 16385, dtype=torch.bfloat16, device=device)
        rms_norm_gemv(big, big[0], EPS, torch.zeros(2, 16385, dtype=torch.bfloat16, device=device))
