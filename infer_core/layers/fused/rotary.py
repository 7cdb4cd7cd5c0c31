"""Rotary embedding (neox layout) applied in place on q and k, both in one launch.

Each program takes one token and a block of heads, of q or of k: the token's cos/sin row is
gathered from the float32 ``cos_sin_cache`` ``[max_position, rot_dim]`` (cos in the first half,
sin in the second) by its position id. Only the first ``rot_dim`` channels of a head are
rewritten (partial rotary leaves the rest as they are). q and k may be strided views into the
fused qkv output: that buffer is rotated where it lies, v untouched.

Numerics are those of ``infer_core.layers.rotary.RotaryEmbedding`` (and HF): cos and sin are
rounded to the input dtype, each product is rounded, then their sum (the launch turns off fma
contraction, which would fuse a product with the sum and skip its rounding): bit-equal to torch
on the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter


@triton.jit
def _rotate_heads(x_ptr, first_head, num_heads, stride_h, stride_d, cos, sin, d, d_ok,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    heads = first_head + tl.arange(0, BLOCK_H)
    mask = (heads < num_heads)[:, None] & d_ok[None, :]
    p1 = x_ptr + heads[:, None].to(tl.int64) * stride_h + d[None, :] * stride_d
    p2 = p1 + HALF * stride_d
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p2, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    o1 = (x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)
    o2 = (x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)
    tl.store(p1, o1.to(dtype), mask=mask)
    tl.store(p2, o2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_sin_ptr,
    positions_ptr,
    num_q_heads,
    num_k_heads,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_k_t,
    stride_k_h,
    stride_k_d,
    stride_cache,
    HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    num_q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HALF
    row = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * stride_cache
    dtype = q_ptr.dtype.element_ty
    cos = tl.load(row + d, mask=d_ok, other=0.0).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(row + HALF + d, mask=d_ok, other=0.0).to(dtype).to(tl.float32)[None, :]
    if head_block < num_q_blocks:
        _rotate_heads(q_ptr + token * stride_q_t, head_block * BLOCK_H, num_q_heads, stride_q_h, stride_q_d,
                      cos, sin, d, d_ok, HALF, BLOCK_H)
    else:
        _rotate_heads(k_ptr + token * stride_k_t, (head_block - num_q_blocks) * BLOCK_H, num_k_heads, stride_k_h,
                      stride_k_d, cos, sin, d, d_ok, HALF, BLOCK_H)


def rotary_inplace(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                   rot_dim: int, *, block_h: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q ``[T, Hq, D]`` and k ``[T, Hk, D]`` in place by ``positions`` ``[T]``; returns (q, k).

    Positions must lie below ``cos_sin_cache.shape[0]``: they are not checked (no host sync).
    """
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [T, heads, head_dim] of one T and D")
    if q.dtype != k.dtype:
        raise ValueError(f"q ({q.dtype}) and k ({k.dtype}) must share a dtype")
    if rot_dim % 2 or rot_dim > q.shape[2] or cos_sin_cache.shape[-1] != rot_dim or cos_sin_cache.stride(-1) != 1:
        raise ValueError(f"rot_dim {rot_dim} must be even, at most head_dim {q.shape[2]}, and the width of "
                         f"cos_sin_cache {tuple(cos_sin_cache.shape)} (rows contiguous)")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions {tuple(positions.shape)} must hold one id per token ({q.shape[0]})")
    num_tokens, num_q_heads, num_k_heads = q.shape[0], q.shape[1], k.shape[1]
    if num_tokens == 0 or rot_dim == 0:
        return q, k
    half = rot_dim // 2
    if block_h is None:
        block_h = min(triton.next_power_of_2(max(num_q_heads, num_k_heads)), max(1, 1024 // half))
    num_blocks = triton.cdiv(num_q_heads, block_h) + triton.cdiv(num_k_heads, block_h)
    block_d = triton.next_power_of_2(half)
    num_warps = max(1, min(8, block_h * block_d // 256))
    pdl = use_pdl(q)
    _rotary_kernel[(num_tokens, num_blocks)](
        q, k, cos_sin_cache, positions, num_q_heads, num_k_heads, *q.stride(), *k.stride(), cos_sin_cache.stride(0),
        HALF=half, BLOCK_D=block_d, BLOCK_H=block_h, num_warps=num_warps,
        enable_fp_fusion=False,  # else x1*cos - x2*sin becomes one fma, skipping the roundings torch does
        USE_PDL=pdl, launch_pdl=pdl,
    )
    return q, k
