"""Qwen3's per-head q-norm and k-norm, then rotary (neox layout), in place on q and k in one launch.

The model otherwise runs three launches per layer (RMSNorm on q, RMSNorm on k, rotary); at batch
1 inside a CUDA graph each costs the graph's per-kernel floor, far more than its bytes. Here each
program takes one token and a block of heads (of q or of k), normalises each head row and rotates
its first ``rot_dim`` channels, and writes the result where the row lies: q and k may be strided
views into the fused qkv output, which is rewritten in place (v untouched, nothing allocated).

Numerics are those of ``RMSNorm.forward_torch`` followed by ``RotaryEmbedding.forward_torch``:
the mean of squares in float32, the normalised row rounded to the input dtype, times the weight
and rounded again; then cos and sin rounded to the input dtype, each product rounded, then their
sum (the launch turns off fma contraction, which would skip a product's rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter

HEAD_ELEMENTS = 2048  # heads of one token are packed into one program up to about this many elements


@triton.jit
def _round(x, dtype: tl.constexpr):
    """``x`` rounded to ``dtype`` and back to float32, as a torch op in ``dtype`` rounds its result."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _norm_rotate_heads(x_ptr, w_ptr, first_head, num_heads, stride_h, stride_d, cos, sin, eps,
                       HEAD_DIM: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       BLOCK_REST: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rows ``[first_head, first_head + BLOCK_H)`` of one token: channels [0, HALF) and [HALF, 2 HALF)
    are the rotated pair, [2 HALF, HEAD_DIM) (``REST`` of them, partial rotary) are only normalised."""
    dtype = x_ptr.dtype.element_ty
    heads = first_head + tl.arange(0, BLOCK_H)
    head_ok = (heads < num_heads)[:, None]
    row = x_ptr + heads[:, None].to(tl.int64) * stride_h
    d = tl.arange(0, BLOCK_HALF)
    d_ok = d < HALF
    mask = head_ok & d_ok[None, :]
    p1 = row + d[None, :] * stride_d
    p2 = p1 + HALF * stride_d
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
    if REST > 0:
        r = tl.arange(0, BLOCK_REST)
        r_ok = r < REST
        p_rest = row + (2 * HALF + r[None, :]) * stride_d
        x_rest = tl.load(p_rest, mask=head_ok & r_ok[None, :], other=0.0).to(tl.float32)
        sum_sq += tl.sum(x_rest * x_rest, axis=1)
    rstd = tl.math.rsqrt(sum_sq / HEAD_DIM + eps)[:, None]

    w1 = tl.load(w_ptr + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + HALF + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    y1 = _round(w1 * _round(x1 * rstd, dtype), dtype)
    y2 = _round(w2 * _round(x2 * rstd, dtype), dtype)
    o1 = _round(y1 * cos, dtype) - _round(y2 * sin, dtype)
    o2 = _round(y2 * cos, dtype) + _round(y1 * sin, dtype)
    tl.store(p1, o1.to(dtype), mask=mask)
    tl.store(p2, o2.to(dtype), mask=mask)
    if REST > 0:
        w_rest = tl.load(w_ptr + 2 * HALF + r, mask=r_ok, other=0.0).to(tl.float32)[None, :]
        y_rest = w_rest * _round(x_rest * rstd, dtype)
        tl.store(p_rest, y_rest.to(dtype), mask=head_ok & r_ok[None, :])


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    q_weight_ptr,
    k_weight_ptr,
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
    eps,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    REST: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    num_q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    d_ok = d < HALF
    row = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * stride_cache
    dtype = q_ptr.dtype.element_ty
    cos = _round(tl.load(row + d, mask=d_ok, other=0.0), dtype)[None, :]
    sin = _round(tl.load(row + HALF + d, mask=d_ok, other=0.0), dtype)[None, :]
    if head_block < num_q_blocks:
        _norm_rotate_heads(q_ptr + token * stride_q_t, q_weight_ptr, head_block * BLOCK_H, num_q_heads, stride_q_h,
                           stride_q_d, cos, sin, eps, HEAD_DIM, HALF, REST, BLOCK_HALF, BLOCK_REST, BLOCK_H)
    else:
        _norm_rotate_heads(k_ptr + token * stride_k_t, k_weight_ptr, (head_block - num_q_blocks) * BLOCK_H,
                           num_k_heads, stride_k_h, stride_k_d, cos, sin, eps, HEAD_DIM, HALF, REST, BLOCK_HALF,
                           BLOCK_REST, BLOCK_H)


def _check(positions, q, k, q_weight, k_weight, cos_sin_cache, rot_dim) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [T, heads, head_dim] of one T and D")
    head_dim = q.shape[2]
    if not (q.dtype == k.dtype == q_weight.dtype == k_weight.dtype):
        raise ValueError(f"q ({q.dtype}), k ({k.dtype}) and the norm weights ({q_weight.dtype}, {k_weight.dtype}) "
                         f"must share a dtype: the result is written in place")
    if q_weight.shape != (head_dim,) or k_weight.shape != (head_dim,):
        raise ValueError(f"norm weights {tuple(q_weight.shape)}, {tuple(k_weight.shape)} must be [head_dim={head_dim}]")
    if rot_dim < 2 or rot_dim % 2 or rot_dim > head_dim or cos_sin_cache.shape[-1] != rot_dim \
            or cos_sin_cache.stride(-1) != 1:
        raise ValueError(f"rot_dim {rot_dim} must be even, positive, at most head_dim {head_dim}, and the width of "
                         f"cos_sin_cache {tuple(cos_sin_cache.shape)} (rows contiguous)")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions {tuple(positions.shape)} must hold one id per token ({q.shape[0]})")


def qk_norm_rope_inplace(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                         k_weight: torch.Tensor, eps: float, cos_sin_cache: torch.Tensor, rot_dim: int, *,
                         block_h: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm every head of q ``[T, Hq, D]`` (by ``q_weight``) and k ``[T, Hk, D]`` (by ``k_weight``),
    then rotate both by ``positions`` ``[T]`` (int32 or int64), in place; returns (q, k).

    ``cos_sin_cache`` is ``RotaryEmbedding.cos_sin_cache`` (float32 ``[max_position, rot_dim]``, cos
    then sin). Positions must lie below its row count: they are not checked (no host sync).
    """
    _check(positions, q, k, q_weight, k_weight, cos_sin_cache, rot_dim)
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    if num_tokens == 0:
        return q, k
    half, rest = rot_dim // 2, head_dim - rot_dim
    block_half = triton.next_power_of_2(half)
    block_rest = triton.next_power_of_2(rest) if rest else 1
    if block_h is None:
        per_head = 2 * block_half + (block_rest if rest else 0)
        block_h = min(triton.next_power_of_2(max(num_q_heads, num_k_heads)), max(1, HEAD_ELEMENTS // per_head))
    num_blocks = triton.cdiv(num_q_heads, block_h) + triton.cdiv(num_k_heads, block_h)
    num_warps = max(1, min(8, block_h * block_half // 256))
    pdl = use_pdl(q)
    _qk_norm_rope_kernel[(num_tokens, num_blocks)](
        q, k, q_weight.contiguous(), k_weight.contiguous(), cos_sin_cache, positions, num_q_heads, num_k_heads,
        *q.stride(), *k.stride(), cos_sin_cache.stride(0), eps, HEAD_DIM=head_dim, HALF=half, REST=rest,
        BLOCK_HALF=block_half, BLOCK_REST=block_rest, BLOCK_H=block_h, num_warps=num_warps,
        enable_fp_fusion=False,  # else y1*cos - y2*sin becomes one fma, skipping the roundings torch does
        USE_PDL=pdl, launch_pdl=pdl,
    )
    return q, k
