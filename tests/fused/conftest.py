"""Without CUDA the fused kernels run in Triton's interpreter: set it before any kernel module is imported.

Only the kernel modules (``infer_core.layers.fused.<op>``) read it, and layers built on the CPU keep
running their torch code under it (``fused.TRITON_DEVICES``), so setting it for the whole process changes
nothing else. A test that runs the kernels through the layers takes the ``triton_on_cpu`` fixture.
"""

from __future__ import annotations

import os

import pytest
import torch


if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter rounds float32 -> bfloat16 by truncation (the GPU rounds to nearest even), so each
# rounding step of a kernel may land one bf16 step away from torch's on the CPU.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def device() -> str:
    return DEVICE


def ulp_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |actual - expected| in steps of the dtype at |expected|.

    Near zero (below 1/256 of the tensor's mean magnitude, where a difference of roundings upstream
    leaves a tiny absolute error) the step at that floor counts instead.
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual.dtype, actual.shape,
                                                                               expected.dtype, expected.shape)
    if not expected.numel():
        return 0.0
    a, e = actual.double(), expected.double()
    floor = max(float(e.abs().mean()) / 256, torch.finfo(expected.dtype).tiny)
    _, exponent = torch.frexp(torch.clamp(e.abs(), min=floor))  # |e| = m * 2**exponent, m in [0.5, 1)
    step = torch.ldexp(torch.full_like(e, torch.finfo(expected.dtype).eps / 2), exponent)
    return float(((a - e).abs() / step).max())


@pytest.fixture
def assert_close_to_reference():
    """float32: within ``fp32_tol`` relative/absolute; half types: within ``ulps`` of the reference."""

    def check(actual: torch.Tensor, expected: torch.Tensor, *, ulps: float, fp32_tol: float = 1e-6) -> None:
        if expected.dtype == torch.float32:
            torch.testing.assert_close(actual, expected, rtol=fp32_tol, atol=fp32_tol)
        else:
            err = ulp_error(actual, expected)
            assert err <= ulps, f"{err:.2f} {expected.dtype} steps from the torch reference (allowed {ulps})"

    return check


def rotated_within_bound(actual, expected, normed, rot_dim: int, steps: int) -> None:
    """float32: within 1e-5. Half types: each channel within ``steps`` dtype steps of the magnitudes it came from.

    The normalised value may land one step away from torch's (the sum of squares is added in another
    order; the interpreter also truncates where the GPU rounds to nearest), and the rotation then
    mixes two such values through roundings of cos, sin, both products and the sum: so a rotated
    channel is bounded by steps of |y1| + |y2| (|cos|, |sin| <= 1), a channel past rot_dim by steps of |y|.
    """
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        return
    half = rot_dim // 2
    y = normed.double().abs()
    pair = y[..., :half] + y[..., half:rot_dim]
    bound = steps * torch.finfo(expected.dtype).eps * torch.cat([pair, pair, y[..., rot_dim:]], dim=-1)
    err = (actual.double() - expected.double()).abs()
    assert bool((err <= bound).all()), f"{float((err - bound).max())} beyond the bound at {int((err > bound).sum())}"


@pytest.fixture
def assert_rotated_like_reference():
    """q/k after norm + rotary against the torch layers (see ``rotated_within_bound``): 4 steps on the
    GPU, 8 under the interpreter (it truncates where the GPU rounds)."""
    steps = 8 if os.environ.get("TRITON_INTERPRET") == "1" else 4
    return lambda actual, expected, normed, rot_dim: rotated_within_bound(actual, expected, normed, rot_dim, steps)

