"""Writing a step's new K/V into the paged cache, and which write a backend uses on its device.

The cache is ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (K then V); slot ``s`` is
token ``s % block_size`` of block ``s // block_size``. :func:`write_kv` is the torch write (an
``index_copy_`` per K and V, on any device); ``fused/kv_write.py`` is the Triton kernel of the same
layout (one launch for both, and a slot of -1 skipped, so padded rows of a captured CUDA graph
are safe). Attention backends of this layout share them instead of each carrying its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from infer_core.layers import fused

logger = logging.getLogger(__name__)

# ``write(kv_cache, key, value, slot_mapping)``
KVWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V rows of the real (unpadded) tokens into the paged cache (no slot may be -1)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    slots = slot_mapping.long()
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
