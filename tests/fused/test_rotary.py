"""The in-place rotary kernel against the layer's torch code (the reference), in the interpreter on the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from infer_core.layers.fused.rotary import rotary_inplace
from infer_core.layers.rotary import RotaryEmbedding
from infer_core.models.config import RopeConfig

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest without CUDA
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def assert_rotated_like(actual, expected, original, rot_dim: int) -> None:
    """Rotated channels as torch rounds them: equal on the GPU (same roundings) and in float16.

    The interpreter truncates float32 -> bfloat16, so there cos, sin, both products and their sum
    may each be one step off, which may be many steps of a small result: the bound is then four
    steps of |x1| + |x2| (which bounds every term, as |cos|, |sin| <= 1).
    """
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    elif expected.dtype == torch.bfloat16 and INTERPRETED:
        half = rot_dim // 2
        x1, x2 = original[..., :half].double(), original[..., half:rot_dim].double()
        bound = 4 * torch.finfo(torch.bfloat16).eps * (x1.abs() + x2.abs()).repeat(1, 1, 2)
        err = (actual[..., :rot_dim].double() - expected[..., :rot_dim].double()).abs()
        assert bool((err <= bound).all()), f"{float((err - bound).max())} beyond the bound"
        assert torch.equal(actual[..., rot_dim:], expected[..., rot_dim:])
    else:
        assert torch.equal(actual, expected), (actual - expected).abs().max()


def make_rotary(head_dim: int, device: str, *, partial: float = 1.0, rope_type: str = "default",
                max_position: int = 4096) -> RotaryEmbedding:
    scaling = (("factor", 4.0), ("original_max_position_embeddings", 1024)) if rope_type == "yarn" else ()
    rope = RopeConfig(theta=10000.0, rope_type=rope_type, scaling=scaling, partial_rotary_factor=partial)
    return RotaryEmbedding(head_dim, rope, max_position, max_position).to(device)


def torch_reference(rotary: RotaryEmbedding, positions, q, k):
    """The layer's torch code (it returns new tensors)."""
    return rotary.forward_torch(positions, q, k)


def fused_qkv(num_tokens, heads, kv_heads, head_dim, dtype, device):
    """(qkv buffer, q view, k view, v view) as the attention layer makes them."""
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    shape = (num_tokens, -1, head_dim)
    return qkv, q.reshape(shape), k.reshape(shape), v.reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 9])
def test_rotates_qkv_views_in_place(dtype, num_tokens, device):
    torch.manual_seed(num_tokens)
    rotary = make_rotary(32, device)
    qkv, q, k, v = fused_qkv(num_tokens, 4, 2, 32, dtype, device)
    positions = torch.randint(0, 4096, (num_tokens,), device=device)
    ref_q, ref_k = torch_reference(rotary, positions, q, k)
    v_before, q0, k0 = v.clone(), q.clone(), k.clone()
    out_q, out_k = rotary_inplace(positions, q, k, rotary.cos_sin_cache, rotary.rot_dim)
    assert out_q is q and out_k is k
    assert_rotated_like(q, ref_q, q0, rotary.rot_dim)
    assert_rotated_like(k, ref_k, k0, rotary.rot_dim)
    assert torch.equal(v, v_before)
    # the buffer itself now holds the rotated q and k
    assert torch.equal(qkv[:, : 4 * 32].reshape(num_tokens, 4, 32), q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_rotary_leaves_the_other_channels(dtype, device):
    """rot_dim = head_dim / 2 with an odd half (12): channels past rot_dim are untouched."""
    torch.manual_seed(4)
    rotary = make_rotary(48, device, partial=0.5)
    assert rotary.rot_dim == 24
    _, q, k, _ = fused_qkv(5, 3, 1, 48, dtype, device)
    positions = torch.tensor([0, 7, 3, 4095, 100], device=device)
    ref_q, ref_k = torch_reference(rotary, positions, q, k)
    q0, k0 = q.clone(), k.clone()
    rotary_inplace(positions, q, k, rotary.cos_sin_cache, rotary.rot_dim)
    assert torch.equal(q[..., 24:], q0[..., 24:]) and torch.equal(k[..., 24:], k0[..., 24:])
    assert_rotated_like(q, ref_q, q0, rotary.rot_dim)
    assert_rotated_like(k, ref_k, k0, rotary.rot_dim)


def test_position_zero_is_identity_and_scaled_caches_apply(device):
    """yarn puts its attention factor into the cache; position 0 of an unscaled cache changes nothing."""
    torch.manual_seed(5)
    plain, yarn = make_rotary(16, device), make_rotary(16, device, rope_type="yarn")
    _, q, k, _ = fused_qkv(2, 2, 2, 16, torch.float32, device)
    positions = torch.tensor([0, 0], device=device)
    q0, k0 = q.clone(), k.clone()
    rotary_inplace(positions, q, k, plain.cos_sin_cache, plain.rot_dim)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    ref_q, ref_k = torch_reference(yarn, positions, q, k)
    rotary_inplace(positions, q, k, yarn.cos_sin_cache, yarn.rot_dim)
    torch.testing.assert_close(q, ref_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, ref_k, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(q, q0)  # the yarn factor scaled it


def test_head_major_strides_and_more_kv_blocks_than_q(device):
    """q laid out [H, T, D] and seen as [T, H, D]; k with more heads than one block (block_h=2)."""
    torch.manual_seed(6)
    rotary = make_rotary(20, device)
    q = torch.randn(3, 6, 20, device=device).transpose(0, 1)  # [T=6, H=3, D]
    k = torch.randn(6, 5, 20, device=device)
    positions = torch.arange(10, 16, device=device, dtype=torch.int32)
    ref_q, ref_k = torch_reference(rotary, positions.long(), q, k)
    q0, k0 = q.clone(), k.clone()
    rotary_inplace(positions, q, k, rotary.cos_sin_cache, rotary.rot_dim, block_h=2)
    assert_rotated_like(q, ref_q, q0, rotary.rot_dim)
    assert_rotated_like(k, ref_k, k0, rotary.rot_dim)


def test_bad_shapes_are_refused(device):
    rotary = make_rotary(16, device)
    q, k = torch.randn(2, 2, 16, device=device), torch.randn(3, 2, 16, device=device)
    with pytest.raises(ValueError, match="one T"):
        rotary_inplace(torch.zeros(2, dtype=torch.long, device=device), q, k, rotary.cos_sin_cache, 16)
    with pytest.raises(ValueError, match="rot_dim"):
        rotary_inplace(torch.zeros(2, dtype=torch.long, device=device), q, q.clone(), rotary.cos_sin_cache, 8)
