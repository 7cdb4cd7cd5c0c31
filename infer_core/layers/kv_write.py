"""Writing a step's new K/V into the paged cache, and which write a backend uses on its device.

The cache is ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (K then V); slot ``s`` is
token ``s % block_size`` of block ``s // block_size``. :func:`write_kv` is the torch write (an
``index_copy_`` per K and V, on any device); ``fused/kv_write.py`` is the Triton kernel of the same
layout (one launch for both, and a slot of -1 skipped, so padded rows of a captured CUDA graph
are safe). Attention backends of this layout share them instead of each carrying its own.

An FP8 cache (``INFER_KV_CACHE_DTYPE=fp8``, float8 e4m3) holds ``x / scale`` clamped to +-448 and is
read back as ``stored * scale``, with the layer's ``k_scale``/``v_scale``; :func:`quantize_kv` is the
reference every kernel's write is tested against, and :func:`dequantize_kv` the values a read means. The
attention backends read the keys unscaled (e4m3 values are exact in any float dtype) and fold ``k_scale``
into the softmax scale: rounding ``stored * k_scale`` to bfloat16 would err by 2^-9 of each key, a large
fraction of a logit at keys near the e4m3 range.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from infer_core.layers import fused

logger = logging.getLogger(__name__)

# ``write(kv_cache, key, value, slot_mapping, k_scale=1.0, v_scale=1.0)`` (the scales: an FP8 cache's)
KVWriter = Callable[..., None]

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x / scale`` in float32, clamped to the e4m3 range, rounded to the nearest e4m3 value.

    The divisor is a tensor on ``x``'s device: CUDA divides by a host scalar as a product with its
    reciprocal, which can round differently from the division the kernels make."""
    divisor = torch.tensor(scale, dtype=torch.float32, device=x.device)
    return (x.float() / divisor).clamp_(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Rows of an FP8 cache as ``dtype``: ``stored * scale`` in float32, rounded once."""
    return (x.float() * scale).to(dtype)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new K/V rows of the real (unpadded) tokens into the paged cache (no slot may be -1).

    An FP8 cache stores :func:`quantize_kv` of the rows (its bytes copied through a uint8 view:
    the CPU has no float8 ``index_copy_``)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    slots = slot_mapping.long()
    if kv_cache.dtype == FP8_KV_DTYPE:
        k, v = quantize_kv(k, k_scale).view(torch.uint8), quantize_kv(v, v_scale).view(torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v)


def choose_kv_writer(is_cuda: bool) -> KVWriter:
    """The write for a backend on this device: the Triton kernel on CUDA where triton imports, else :func:`write_kv`."""
    if is_cuda and fused.triton_available():
        try:
            from infer_core.layers.fused.kv_write import write_kv as triton_write_kv
        except ImportError as e:  # triton present but unusable here: the torch write works
            logger.warning("the Triton KV write cannot be used (%s); using the torch write", e)
        else:
            return triton_write_kv
    return write_kv
