"""Qwen3's per-head q-norm and k-norm, then rotary (neox layout), in place on q and k in one launch.

The model otherwise runs three launches per layer (RMSNorm on q, RMSNorm on k, rotary); at batch
1 inside a CUDA graph each costs the graph's per-kernel floor, far more than its bytes. Here each
program takes one token and a block of heads (of q or of k), normalises each head row and rotates
its first ``rot_dim`` channels, and writes the result where the row lies: q and k may be strided
views into the fused qkv output, which is rewritten in place (v untouched, nothing allocated).

Given a paged KV cache and the step's ``slot_mapping``, the k programs also store the finished k rows
and the token's v rows at its slot: the attention backend's own KV-write launch is then skipped
(``AttentionBackend.standard_kv_slot_mapping``). The cache receives the very values written back to k;
an FP8 cache receives them quantized (``fused/kv_write.quantize_fp8`` with the layer's k and v scales,
None and compiled out for a cache in the model's dtype).

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
from infer_core.layers.fused.kv_write import quantize_fp8
from infer_core.layers.fused.pdl import pdl_enter

HEAD_ELEMENTS = 2048  # heads of one token are packed into one program up to about this many elements


@triton.jit
def _round(x, dtype: tl.constexpr):
    """``x`` rounded to ``dtype`` and back to float32, as a torch op in ``dtype`` rounds its result."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _norm_rotate_heads(x_ptr, w_ptr, first_head, num_heads, stride_h, stride_d, cos, sin, eps,
                       copy_ptr, num_copy_heads, stride_copy_h, stride_copy_d, copy_scale,
                       HEAD_DIM: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       BLOCK_REST: tl.constexpr, BLOCK_H: tl.constexpr, COPY: tl.constexpr, COPY_FP8: tl.constexpr):
    """Rows ``[first_head, first_head + BLOCK_H)`` of one token: channels [0, HALF) and [HALF, 2 HALF)
    are the rotated pair, [2 HALF, HEAD_DIM) (``REST`` of them, partial rotary) are only normalised.

    With ``COPY`` the finished rows of heads below ``num_copy_heads`` are also stored at ``copy_ptr``
    (the token's KV-cache row; 0 heads when the token has no slot), with ``COPY_FP8`` quantized by
    ``copy_scale``."""
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
    if COPY:
        copy_ok = (heads < num_copy_heads)[:, None]
        c1 = copy_ptr + heads[:, None].to(tl.int64) * stride_copy_h + d[None, :] * stride_copy_d
        if COPY_FP8:
            fp8 = copy_ptr.dtype.element_ty
            tl.store(c1, quantize_fp8(o1.to(dtype), copy_scale, fp8), mask=copy_ok & d_ok[None, :])
            tl.store(c1 + HALF * stride_copy_d, quantize_fp8(o2.to(dtype), copy_scale, fp8),
                     mask=copy_ok & d_ok[None, :])
        else:
            tl.store(c1, o1.to(dtype), mask=copy_ok & d_ok[None, :])
            tl.store(c1 + HALF * stride_copy_d, o2.to(dtype), mask=copy_ok & d_ok[None, :])
    if REST > 0:
        w_rest = tl.load(w_ptr + 2 * HALF + r, mask=r_ok, other=0.0).to(tl.float32)[None, :]
        y_rest = w_rest * _round(x_rest * rstd, dtype)
        tl.store(p_rest, y_rest.to(dtype), mask=head_ok & r_ok[None, :])
        if COPY:
            c_rest = copy_ptr + heads[:, None].to(tl.int64) * stride_copy_h + (2 * HALF + r[None, :]) * stride_copy_d
            if COPY_FP8:
                tl.store(c_rest, quantize_fp8(y_rest.to(dtype), copy_scale, copy_ptr.dtype.element_ty),
                         mask=copy_ok & r_ok[None, :])
            else:
                tl.store(c_rest, y_rest.to(dtype), mask=copy_ok & r_ok[None, :])


@triton.jit
def _copy_heads(src_ptr, dst_ptr, first_head, num_heads, stride_src_h, stride_src_d, stride_dst_h, stride_dst_d,
                scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """Rows ``[first_head, first_head + BLOCK_H)`` (below ``num_heads``) of one token copied unchanged
    (``FP8``: quantized by ``scale``)."""
    heads = (first_head + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (d < HEAD_DIM)
    rows = tl.load(src_ptr + heads * stride_src_h + d * stride_src_d, mask=mask)
    if FP8:
        rows = quantize_fp8(rows, scale, dst_ptr.dtype.element_ty)
    tl.store(dst_ptr + heads * stride_dst_h + d * stride_dst_d, rows, mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_sin_ptr,
    positions_ptr,
    kv_cache_ptr,
    slot_mapping_ptr,
    num_q_heads,
    num_k_heads,
    num_slots,
    block_size,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_k_t,
    stride_k_h,
    stride_k_d,
    stride_v_t,
    stride_v_h,
    stride_v_d,
    stride_cos_sin,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_row,
    stride_cache_h,
    stride_cache_d,
    eps,
    k_scale,  # an FP8 cache's scales; None otherwise
    v_scale,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    REST: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_KV: tl.constexpr,
    USE_PDL: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    num_q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    d_ok = d < HALF
    row = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * stride_cos_sin
    dtype = q_ptr.dtype.element_ty
    cos = _round(tl.load(row + d, mask=d_ok, other=0.0), dtype)[None, :]
    sin = _round(tl.load(row + HALF + d, mask=d_ok, other=0.0), dtype)[None, :]
    if head_block < num_q_blocks:
        _norm_rotate_heads(q_ptr + token * stride_q_t, q_weight_ptr, head_block * BLOCK_H, num_q_heads, stride_q_h,
                           stride_q_d, cos, sin, eps, q_ptr, 0, 0, 0, k_scale, HEAD_DIM, HALF, REST, BLOCK_HALF,
                           BLOCK_REST, BLOCK_H, False, False)
    else:
        first_head = (head_block - num_q_blocks) * BLOCK_H
        if WRITE_KV:
            # Tokens past slot_mapping (padding of a captured batch) and slot -1 keep nothing in the cache.
            slot = tl.load(slot_mapping_ptr + token, mask=token < num_slots, other=-1).to(tl.int64)
            num_stored_heads = tl.where(slot >= 0, num_k_heads, 0)
            slot = tl.maximum(slot, 0)
            k_dst = kv_cache_ptr + (slot // block_size) * stride_cache_block + (slot % block_size) * stride_cache_row
        else:
            num_stored_heads = 0
            k_dst = kv_cache_ptr
        _norm_rotate_heads(k_ptr + token * stride_k_t, k_weight_ptr, first_head, num_k_heads, stride_k_h,
                           stride_k_d, cos, sin, eps, k_dst, num_stored_heads, stride_cache_h, stride_cache_d, k_scale,
                           HEAD_DIM, HALF, REST, BLOCK_HALF, BLOCK_REST, BLOCK_H, WRITE_KV, KV_FP8)
        if WRITE_KV:
            _copy_heads(v_ptr + token * stride_v_t, k_dst + stride_cache_kv, first_head, num_stored_heads, stride_v_h,
                        stride_v_d, stride_cache_h, stride_cache_d, v_scale, HEAD_DIM, BLOCK_D, BLOCK_H, KV_FP8)


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


def _check_kv(k: torch.Tensor, kv_cache, v, slot_mapping) -> None:
    if kv_cache is None or v is None or slot_mapping is None:
        raise ValueError("kv_cache, v and slot_mapping go together: pass all three to store k/v, or none")
    num_tokens, num_kv_heads, head_dim = k.shape
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or tuple(kv_cache.shape[3:]) != (num_kv_heads, head_dim):
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} is not [2, num_blocks, block_size, {num_kv_heads}, "
                         f"{head_dim}] for k {tuple(k.shape)}")
    if v.shape != k.shape or v.dtype != k.dtype or kv_cache.dtype not in (k.dtype, torch.float8_e4m3fn):
        raise ValueError(f"v {tuple(v.shape)} {v.dtype} must match k {tuple(k.shape)} {k.dtype}, and kv_cache "
                         f"({kv_cache.dtype}) hold k's dtype (the rows as they are) or float8_e4m3fn (quantized)")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] > num_tokens or slot_mapping.dtype not in (torch.int32,
                                                                                                  torch.int64):
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} {slot_mapping.dtype} must be int32/int64 with "
                         f"at most one slot per token ({num_tokens})")


def qk_norm_rope_inplace(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                         k_weight: torch.Tensor, eps: float, cos_sin_cache: torch.Tensor, rot_dim: int, *,
                         block_h: int | None = None, kv_cache: torch.Tensor | None = None,
                         v: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None,
                         k_scale: float = 1.0, v_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm every head of q ``[T, Hq, D]`` (by ``q_weight``) and k ``[T, Hk, D]`` (by ``k_weight``),
    then rotate both by ``positions`` ``[T]`` (int32 or int64), in place; returns (q, k).

    ``cos_sin_cache`` is ``RotaryEmbedding.cos_sin_cache`` (float32 ``[max_position, rot_dim]``, cos
    then sin). Positions must lie below its row count: they are not checked (no host sync).

    With ``kv_cache`` (``[2, num_blocks, block_size, Hk, D]``, the standard paged layout), ``v``
    ``[T, Hk, D]`` and ``slot_mapping`` (``[<= T]``): token t's finished k rows and its v rows are also
    stored at slot ``slot_mapping[t]`` (block ``s // block_size``, row ``s % block_size``); a slot of
    -1, and tokens past ``slot_mapping``'s length, are not stored. Slots are not range-checked either.
    A float8 e4m3 cache stores k / ``k_scale`` and v / ``v_scale`` (clamped to +-448).
    """
    _check(positions, q, k, q_weight, k_weight, cos_sin_cache, rot_dim)
    write_kv = kv_cache is not None or v is not None or slot_mapping is not None
    if write_kv:
        _check_kv(k, kv_cache, v, slot_mapping)
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
    if write_kv:
        cache_strides = (kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
                         kv_cache.stride(4))
        num_slots, block_size, v_strides = slot_mapping.shape[0], kv_cache.shape[2], v.stride()
    else:  # the pointers are never read: k stands in for them
        kv_cache, v, slot_mapping = k, k, positions
        cache_strides, num_slots, block_size, v_strides = (0,) * 5, 0, 1, (0, 0, 0)
    kv_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    pdl = use_pdl(q)
    _qk_norm_rope_kernel[(num_tokens, num_blocks)](
        q, k, v, q_weight.contiguous(), k_weight.contiguous(), cos_sin_cache, positions, kv_cache, slot_mapping,
        num_q_heads, num_k_heads, num_slots, block_size, *q.stride(), *k.stride(), *v_strides,
        cos_sin_cache.stride(0), *cache_strides, eps, k_scale if kv_fp8 else None, v_scale if kv_fp8 else None,
        HEAD_DIM=head_dim, HALF=half, REST=rest,
        BLOCK_HALF=block_half, BLOCK_REST=block_rest, BLOCK_H=block_h, BLOCK_D=triton.next_power_of_2(head_dim),
        WRITE_KV=write_kv, num_warps=num_warps,
        enable_fp_fusion=False,  # else y1*cos - y2*sin becomes one fma, skipping the roundings torch does
        USE_PDL=pdl, KV_FP8=kv_fp8, launch_pdl=pdl,
    )
    return q, k
