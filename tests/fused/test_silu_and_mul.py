"""The SiLU-and-mul kernel against the layer's torch code (the reference), in the interpreter on the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from infer_core.layers.activation import SiluAndMul
from infer_core.layers.fused.silu_and_mul import silu_and_mul

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest without CUDA
# silu rounded, then the product rounded; on the GPU exp is approximate, which may move silu one step
HALF_ULPS = 3 if INTERPRETED else 1  # the interpreter truncates each of the two roundings


def torch_reference(x: torch.Tensor) -> torch.Tensor:
    return SiluAndMul().forward_torch(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens,n_inter", [(1, 8), (4, 37), (3, 1100)])
def test_matches_torch(dtype, num_tokens, n_inter, device, assert_close_to_reference):
    torch.manual_seed(n_inter)
    x = (torch.randn(num_tokens, 2 * n_inter, device=device) * 4).to(dtype)
    out = silu_and_mul(x)
    assert out.shape == (num_tokens, n_inter) and out.dtype == dtype
    assert_close_to_reference(out, torch_reference(x), ulps=HALF_ULPS)


def test_strided_rows_and_leading_dims(device, assert_close_to_reference):
    torch.manual_seed(7)
    wide = torch.randn(5, 64, device=device)
    x = wide[:, 3:43]  # rows 64 apart, 2I = 40
    assert not x.is_contiguous()
    assert_close_to_reference(silu_and_mul(x), torch_reference(x), ulps=0)
    x3 = torch.randn(2, 3, 18, device=device)
    assert_close_to_reference(silu_and_mul(x3), torch_reference(x3), ulps=0)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's numpy
def test_extremes(device):
    """Large negative gates give -0/0 (not NaN), large positive ones give gate * up."""
    gate = torch.tensor([[-100.0, -30.0, 0.0, 30.0, 100.0]], device=device)
    up = torch.tensor([[2.0, 2.0, 2.0, 2.0, 2.0]], device=device)
    out = silu_and_mul(torch.cat([gate, up], dim=-1))
    assert not out.isnan().any()
    torch.testing.assert_close(out, torch_reference(torch.cat([gate, up], dim=-1)), rtol=1e-6, atol=1e-6)


def test_odd_width_is_refused(device):
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(2, 7, device=device))
