"""The RMSNorm kernel against the layer's torch code (the reference), in the interpreter on the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.layers.norm import RMSNorm

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest without CUDA
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HALF_ULPS = 4 if INTERPRETED else 2  # three roundings (sum, normalised row, times weight)


def reference_norm(n: int, dtype: torch.dtype, device: str, eps: float = 1e-6) -> RMSNorm:
    norm = RMSNorm(n, eps, dtype=dtype).to(device)
    norm.weight.data = torch.randn(n, dtype=torch.float32, device=device).to(dtype)
    return norm


def torch_reference(norm: RMSNorm, x, residual=None):
    """The layer's torch code, whatever the layer would dispatch to."""
    return norm.forward_torch(x, residual)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,n", [(1, 64), (5, 7), (3, 300), (17, 128)])
def test_residual_add_and_norm_match_torch(dtype, num_tokens, n, device, assert_close_to_reference):
    torch.manual_seed(n + num_tokens)
    norm = reference_norm(n, dtype, device)
    x = torch.randn(num_tokens, n, device=device).to(dtype) * 3
    residual = torch.randn(num_tokens, n, device=device).to(dtype)
    out, summed = rms_norm(x, norm.weight, norm.eps, residual)
    ref_out, ref_summed = torch_reference(norm, x, residual)
    assert out.dtype == ref_out.dtype and out.shape == ref_out.shape
    assert_close_to_reference(summed, ref_summed, ulps=1 if INTERPRETED else 0)
    assert_close_to_reference(out, ref_out, ulps=HALF_ULPS)
    if dtype == torch.float16 or dtype == torch.float32:  # the add is one correctly rounded op
        assert torch.equal(summed, ref_summed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_without_residual(dtype, device, assert_close_to_reference):
    torch.manual_seed(0)
    norm = reference_norm(99, dtype, device, eps=1e-5)
    x = torch.randn(6, 99, device=device).to(dtype)
    assert_close_to_reference(rms_norm(x, norm.weight, norm.eps), torch_reference(norm, x), ulps=HALF_ULPS)


def test_eps_matters(device):
    """A row of tiny values: the result depends on eps, so a kernel that drops it fails."""
    norm = reference_norm(32, torch.float32, device, eps=1e-2)
    x = torch.full((2, 32), 1e-3, device=device)
    torch.testing.assert_close(rms_norm(x, norm.weight, 1e-2), torch_reference(norm, x), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(rms_norm(x, norm.weight, 1e-6), torch_reference(norm, x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_pass_path_for_long_rows(dtype, device, assert_close_to_reference):
    """Rows longer than the single-pass limit are normalised over column chunks (limit lowered here)."""
    torch.manual_seed(1)
    norm = reference_norm(45, dtype, device)
    x, residual = (torch.randn(3, 45, device=device).to(dtype) for _ in range(2))
    out, summed = rms_norm(x, norm.weight, norm.eps, residual, max_single_pass=8)
    ref_out, ref_summed = torch_reference(norm, x, residual)
    assert_close_to_reference(summed, ref_summed, ulps=1 if INTERPRETED else 0)
    assert_close_to_reference(out, ref_out, ulps=HALF_ULPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_head_norm_of_strided_qkv_views(dtype, device, assert_close_to_reference):
    """Qwen3's q/k norm: x is [T, H, D], a strided view into the fused qkv output."""
    torch.manual_seed(2)
    num_tokens, heads, kv_heads, head_dim = 5, 4, 2, 16
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.reshape(num_tokens, heads, head_dim), k.reshape(num_tokens, kv_heads, head_dim)
    assert not q.is_contiguous()
    before = qkv.clone()
    for x in (q, k):
        norm = reference_norm(head_dim, dtype, device)
        out = rms_norm(x, norm.weight, norm.eps)
        assert out.is_contiguous() and out.shape == x.shape
        assert_close_to_reference(out, torch_reference(norm, x), ulps=HALF_ULPS)
    assert torch.equal(qkv, before)  # not written in place


def test_non_contiguous_rows_with_residual(device, assert_close_to_reference):
    torch.manual_seed(3)
    norm = reference_norm(40, torch.float32, device)
    x = torch.randn(7, 100, device=device)[:, 10:50]
    residual = torch.randn(40, 7, device=device).t()
    out, summed = rms_norm(x, norm.weight, norm.eps, residual)
    ref_out, ref_summed = torch_reference(norm, x, residual)
    assert_close_to_reference(out, ref_out, ulps=0)
    assert torch.equal(summed, ref_summed)


def test_mismatched_residual_is_refused(device):
    norm = reference_norm(8, torch.float32, device)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(torch.randn(2, 8, device=device), norm.weight, 1e-6, torch.randn(2, 8, device=device).half())


def test_sum_into_a_given_tensor(device):
    """``residual_out``: the sum is written there (the norm before a projection hands that tensor on first)."""
    torch.manual_seed(4)
    norm = reference_norm(48, torch.bfloat16, device)
    x, residual = (torch.randn(3, 48, device=device).to(torch.bfloat16) for _ in range(2))
    want_out, want_sum = rms_norm(x, norm.weight, norm.eps, residual)
    residual_out = torch.empty_like(x)
    out, summed = rms_norm(x, norm.weight, norm.eps, residual, residual_out=residual_out)
    assert summed is residual_out and torch.equal(summed, want_sum) and torch.equal(out, want_out)
    for bad in (torch.empty(3, 47, device=device), torch.empty(3, 48, device=device), torch.empty(48, 3).t()):
        with pytest.raises(ValueError, match="residual_out"):
            rms_norm(x, norm.weight, norm.eps, residual, residual_out=bad.to(device))


def test_the_single_pass_tile_a_fused_norm_sums_on():
    """What a kernel computing the norm itself (``norm_rows.rows_rstd``) must take: this kernel's one-pass tile and
    warps; rows too long for one pass are refused with what to do."""
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS, _tiles, single_pass_tile

    for k in (48, 80, 128, 1000, 2048, 4096, 5120, MAX_SINGLE_PASS):
        block_m, block_n, single, warps = _tiles(k, MAX_SINGLE_PASS)
        assert single and single_pass_tile(k) == (block_m, block_n, warps), k
    with pytest.raises(ValueError, match="run rms_norm, then the kernel"):
        single_pass_tile(MAX_SINGLE_PASS + 1)
