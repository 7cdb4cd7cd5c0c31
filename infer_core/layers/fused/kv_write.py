"""Scatter a step's new K/V into the paged cache, one launch for every token and head.

The attention backends that keep the standard paged layout (the Triton and flash plugins) write
with this kernel; ``layers/kv_write.py`` holds the torch write of the same layout and chooses
between the two. Plugins import ``write_kv``, so its signature is kept stable.

An FP8 cache is written quantized (``x / scale``, clamped to +-448, rounded to e4m3), as
``layers/kv_write.quantize_kv`` does; the scales are the kernel's only extra arguments, passed as
None (compile-time constants, so no parameter) and with the FP8 branch compiled out for a cache in
the model's dtype: that launch is the kernel it always was.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import interpreting, use_pdl
from infer_core.layers.fused.pdl import pdl_enter

FP8_MAX = tl.constexpr(448.0)  # the largest finite e4m3 value (layers/kv_write.py's FP8_MAX)
# The interpreter's float32 -> e4m3 cast does not carry a mantissa that rounds up into the exponent
# (124 becomes 64, not 128): there the value is rounded to the e4m3 grid first, which the cast keeps.
ROUND_BEFORE_CAST = tl.constexpr(interpreting())


@triton.jit
def _round_to_e4m3(x):
    """``x`` (float32, within +-448) rounded to the nearest e4m3 value, ties to even, still float32."""
    exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step = ((tl.maximum(exponent, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits; subnormals
    units = tl.abs(x) / step  # below 16: adding and removing 1.5 * 2**23 rounds it to an integer, ties to even
    rounded = ((units + 12582912.0) - 12582912.0) * step
    return tl.where(x < 0, -rounded, rounded)  # the sign kept, -0 included


@triton.jit
def quantize_fp8(x, scale, dtype: tl.constexpr):
    """``x / scale`` in float32, clamped to the e4m3 range, as ``dtype`` (the FP8 cache's element type).

    The division is IEEE round-to-nearest (``div_rn``; ``/`` compiles to an approximate one), so the bytes
    stored are torch's (``layers/kv_write.quantize_kv``)."""
    y = tl.clamp(tl.math.div_rn(x.to(tl.float32), scale), -FP8_MAX, FP8_MAX)
    if ROUND_BEFORE_CAST:
        y = _round_to_e4m3(y)
    return y.to(dtype)


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,
    slot_mapping_ptr,
    stride_key_t,
    stride_key_h,
    stride_value_t,
    stride_value_h,
    stride_cache_kv,
    stride_cache_slot,
    stride_cache_h,
    num_kv_heads,
    head_dim,
    k_scale,  # an FP8 cache's scales; None otherwise
    v_scale,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One program per token: copies its [num_kv_heads, head_dim] K and V rows to their slot."""
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # a token whose KV is not kept (padding)
        return
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_kv_heads) & (dims < head_dim)
    token = token.to(tl.int64)
    key = tl.load(key_ptr + token * stride_key_t + heads * stride_key_h + dims, mask=mask)
    value = tl.load(value_ptr + token * stride_value_t + heads * stride_value_h + dims, mask=mask)
    dst = cache_ptr + slot * stride_cache_slot + heads * stride_cache_h + dims
    if KV_FP8:
        tl.store(dst, quantize_fp8(key, k_scale, cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + stride_cache_kv, quantize_fp8(value, v_scale, cache_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(dst, key.to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + stride_cache_kv, value.to(cache_ptr.dtype.element_ty), mask=mask)


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into ``kv_cache`` at ``slot_mapping``.

    ``kv_cache`` is ``[2, num_blocks, block_size, num_kv_heads, head_dim]``; slot ``s`` is token
    ``s % block_size`` of block ``s // block_size``; a slot of -1 is skipped. One launch for the
    whole batch; no host sync, so it may run under CUDA-graph capture. A float8 e4m3 cache stores
    ``key / k_scale`` and ``value / v_scale`` (clamped to +-448); other caches ignore the scales.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or tuple(kv_cache.shape[3:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"kv_cache {tuple(kv_cache.shape)} is not [2, num_blocks, block_size, "
            f"{num_kv_heads}, {head_dim}] for key {tuple(key.shape)}"
        )
    if value.shape != key.shape or slot_mapping.shape[0] < num_tokens:
        raise ValueError(
            f"value {tuple(value.shape)} / slot_mapping {tuple(slot_mapping.shape)} do not match key {tuple(key.shape)}"
        )
    if key.stride(2) != 1 or value.stride(2) != 1:
        raise ValueError("key and value need a contiguous last (head_dim) dimension")
    if kv_cache.stride(4) != 1 or kv_cache.stride(1) != kv_cache.shape[2] * kv_cache.stride(2):
        raise ValueError("write_kv needs a kv_cache whose blocks are contiguous (as allocated by the runner)")
    if num_tokens == 0:
        return
    kv_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    pdl = use_pdl(key)
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(2),
        kv_cache.stride(3),
        num_kv_heads,
        head_dim,
        k_scale if kv_fp8 else None,
        v_scale if kv_fp8 else None,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
        USE_PDL=pdl, KV_FP8=kv_fp8, launch_pdl=pdl,
    )
