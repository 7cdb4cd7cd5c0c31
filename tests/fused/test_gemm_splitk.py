"""The split-K GEMM against ``F.linear`` in float32, in the interpreter on the CPU (on CUDA where there is one).

Shapes leave tails everywhere (M=19 and 33 against 16-row tiles, N=37, K=100 against 16- and 32-wide K
steps); tiles are computed both ways (x @ W^T and W @ x^T) at 1 to 5 splits. float32 outputs must be
within float32 rounding of the reference; half-precision outputs within one step of the float32 result
rounded to their dtype (the kernel rounds once, after the bias; the interpreter truncates instead of
rounding to nearest, which is at most one step too). Two calls must give the same bits, and every
tile counter must be back at zero. Under the interpreter the programs run one after another, so the
races of the last-program merge are for ``test_gemm_splitk_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer_core.layers.fused.gemm_splitk import (
    MAX_SPLITS,
    MIN_SPLIT_K,
    TUNED,
    GemmConfig,
    SplitKScratch,
    choose_config,
    device_scratch,
    gemm_splitk,
    normalized_splits,
)
from infer_core.runner.cuda_graphs import capture_sizes

N, K = 37, 100


def cfg(split_k: int, swap_ab: bool, block_m: int = 16, block_n: int = 16, block_k: int = 16) -> GemmConfig:
    return GemmConfig(block_m, block_n, block_k, split_k, swap_ab, num_warps=1, num_stages=1)


CONFIGS = {
    "xw-1": cfg(1, False),
    "xw-2": cfg(2, False),
    "xw-5": cfg(5, False, block_k=16),  # 7 K tiles: splits of 2, 2, 2, 1 (normalised to 4)
    "wx-1": cfg(1, True),
    "wx-3": cfg(3, True),
    "wx-2-wide": cfg(2, True, block_m=32, block_n=32, block_k=32),  # K tail of 4 in the last split
}


def inputs(num_rows: int, n: int, k: int, dtype: torch.dtype, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype)
    return x, w, b


def reference(x, w, b):
    return F.linear(x.float(), w.float(), None if b is None else b.float())


def own_scratch(device) -> SplitKScratch:
    return SplitKScratch.allocate(1 << 16, 64, torch.device(device))


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_rows", [3, 19])
def test_against_f_linear_with_tails(config, dtype, num_rows, device, assert_close_to_reference):
    x, w, b = inputs(num_rows, N, K, dtype, device, seed=num_rows)
    scratch = own_scratch(device)
    for bias in (b, None):
        y = gemm_splitk(x, w, bias, config=CONFIGS[config], scratch=scratch)
        assert y.shape == (num_rows, N) and y.dtype == dtype
        assert_close_to_reference(y, reference(x, w, bias).to(dtype), ulps=1, fp32_tol=2e-6)
        assert torch.equal(y, gemm_splitk(x, w, bias, config=CONFIGS[config], scratch=scratch))
        assert not scratch.tile_counts.any(), "the last program of every tile zeroes its counter"


@pytest.mark.parametrize("swap_ab", [False, True])
def test_float16_and_a_tile_wider_than_the_matrix(swap_ab, device, assert_close_to_reference):
    """M=33 rows in 64-row tiles, N=37 in 64: one tile, mostly padding, at 2 splits over an even K."""
    x, w, b = inputs(33, N, 64, torch.float16, device)
    config = GemmConfig(64, 64, 16, 2, swap_ab, num_warps=4, num_stages=1)
    y = gemm_splitk(x, w, b, config=config, scratch=own_scratch(device))
    assert_close_to_reference(y, reference(x, w, b).to(torch.float16), ulps=1)


def test_leading_dims_and_strided_rows(device, assert_close_to_reference):
    """x as [2, 3, K] and as a row-strided view of a wider tensor: rows are every leading index."""
    x, w, b = inputs(6, N, K, torch.bfloat16, device)
    config, scratch = CONFIGS["xw-2"], own_scratch(device)
    y = gemm_splitk(x.reshape(2, 3, K), w, b, config=config, scratch=scratch)
    assert y.shape == (2, 3, N)
    assert torch.equal(y.reshape(6, N), gemm_splitk(x, w, b, config=config, scratch=scratch))
    wide = torch.zeros(6, K + 12, dtype=x.dtype, device=device)
    wide[:, 5:5 + K] = x
    assert torch.equal(gemm_splitk(wide[:, 5:5 + K], w, b, config=config, scratch=scratch),
                       gemm_splitk(x, w, b, config=config, scratch=scratch))


def test_heuristic_tiles_in_the_interpreter(device, assert_close_to_reference):
    x, w, b = inputs(5, N, K, torch.bfloat16, device, seed=5)
    y = gemm_splitk(x, w, b)
    assert_close_to_reference(y, reference(x, w, b).to(torch.bfloat16), ulps=1)


def test_empty_inputs(device):
    x, w, b = inputs(3, N, K, torch.bfloat16, device)
    assert gemm_splitk(x[:0], w, b).shape == (0, N)
    assert torch.equal(gemm_splitk(x[:, :0], w[:, :0], b), b.expand(3, N))
    assert not gemm_splitk(x[:, :0], w[:, :0]).any()


def test_errors_say_what_to_do(device):
    x, w, b = inputs(3, N, K, torch.bfloat16, device)
    with pytest.raises(ValueError, match=r"must be \[N, 100\]"):
        gemm_splitk(x, w[:, :50])
    with pytest.raises(ValueError, match="convert one of them"):
        gemm_splitk(x, w.float())
    with pytest.raises(ValueError, match="contiguous"):
        gemm_splitk(x, torch.zeros(K, N, dtype=w.dtype, device=device).t())
    with pytest.raises(ValueError, match=r"bias \(36,\) must be \[37\]"):
        gemm_splitk(x, w, b[:-1])
    with pytest.raises(ValueError, match="scratch too small"):
        gemm_splitk(x, w, b, config=CONFIGS["xw-2"], scratch=SplitKScratch.allocate(16, 1, torch.device(device)))


@pytest.mark.parametrize("k,block_k,split_k,expected", [
    (100, 16, 5, (4, 32)),  # 7 tiles: 2 + 2 + 2 + 1 (a fifth split would be empty)
    (1024, 128, 3, (3, 384)),  # 8 tiles: 3 + 3 + 2
    (1024, 128, 16, (8, 128)),  # no more splits than K tiles
    (3072, 64, 5, (5, 640)),
    (64, 64, 4, (1, 64)),
])
def test_normalized_splits(k, block_k, split_k, expected):
    splits, k_per_split = normalized_splits(k, block_k, split_k)
    assert (splits, k_per_split) == expected
    assert (splits - 1) * k_per_split < k <= splits * k_per_split  # every split non-empty, all of K covered


REAL_SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151936, 1024),
               (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)]


@pytest.mark.parametrize("n,k", REAL_SHAPES)
def test_heuristic_on_an_h100(n, k, monkeypatch):
    """At the real shapes on 132 SMs: W @ x^T up to 64 rows; split only where the tiles leave SMs idle,
    then about one wave, splits of whole K tiles at least MIN_SPLIT_K long; stages within shared memory
    (fewer for float32 operands); a batch and the CUDA-graph size it is padded to get the same tiles."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    choose_config.cache_clear()
    sizes = capture_sizes(256)
    try:
        for m in range(3, 257):
            c = choose_config(m, n, k, 2, 132)
            assert c == choose_config(next(s for s in sizes if s >= m), n, k, 2, 132)
            assert c.swap_ab == (m <= 64)
            assert c.block_m >= (16 if c.swap_ab else 64) and c.block_m >= min(m, 128)
            tiles = -(-m // c.block_m) * -(-n // c.block_n)
            assert normalized_splits(k, c.block_k, c.split_k)[0] == c.split_k <= MAX_SPLITS
            if c.split_k > 1:
                assert 4 * tiles < 3 * 132 and tiles * c.split_k < 132 + tiles  # about one wave
                assert normalized_splits(k, c.block_k, c.split_k)[1] >= MIN_SPLIT_K
            for element_size, cfg in ((2, c), (4, choose_config(m, n, k, 4, 132))):
                assert (cfg.block_m + cfg.block_n) * cfg.block_k * element_size * cfg.num_stages <= 200 << 10
    finally:
        choose_config.cache_clear()


def test_tuned_table_wins(monkeypatch):
    """A measured entry for (N, K) takes the rows up to its bound; beyond the last bound the heuristic."""
    small, large = cfg(4, True, block_n=64, block_k=128), cfg(2, False, block_m=128, block_n=64, block_k=64)
    monkeypatch.setitem(TUNED, (4096, 1024), ((16, small), (128, large)))
    choose_config.cache_clear()
    try:
        assert choose_config(3, 4096, 1024, 2, 132) == choose_config(16, 4096, 1024, 2, 132) == small
        assert choose_config(17, 4096, 1024, 2, 132) == choose_config(128, 4096, 1024, 2, 132) == large
        assert choose_config(129, 4096, 1024, 2, 132) not in (small, large)
        assert choose_config(16, 4096, 2048, 2, 132) != small  # another K: not this entry
    finally:
        choose_config.cache_clear()


def test_device_scratch_grows_and_keeps_what_graphs_hold():
    device = torch.device("cpu")
    first = device_scratch(device, 1000, 10)
    assert first.fits(1000, 10) and not first.tile_counts.any()
    assert device_scratch(device, 500, 5) is first  # smaller needs reuse it
    grown = device_scratch(device, first.partials.numel() + 1, 10)
    assert grown is not first and grown.fits(first.partials.numel() + 1, 10)
    assert device_scratch(device, 10, 1) is grown
