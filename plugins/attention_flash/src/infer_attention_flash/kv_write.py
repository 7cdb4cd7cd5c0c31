"""One launch that writes a step's new K/V into the paged cache.

The Triton plugin's fused kernel when it is installed and we are on CUDA (it skips slot -1, so
padded rows of a captured graph are safe); otherwise the core's ``index_copy_`` scatter, which is
also a single launch per K and V.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

KVWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def choose_kv_writer(is_cuda: bool) -> KVWriter:
    """``write_kv(kv_cache, key, value, slot_mapping)`` for this device."""
    if is_cuda and importlib.util.find_spec("infer_attention_triton") is not None:
        try:
            from infer_attention_triton.kv_write import write_kv
        except ImportError as e:  # installed but unusable here (e.g. no triton): the torch write works
            logger.warning("infer_attention_triton's KV write cannot be used (%s); using the torch write", e)
        else:
            return write_kv
    from infer_core.builtin.attention_torch import write_kv

    return write_kv
