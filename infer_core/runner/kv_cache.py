"""Sizing and allocating the paged KV cache of one rank."""

from __future__ import annotations

import logging

import torch

from infer_core.layers.kv_write import FP8_KV_DTYPE

logger = logging.getLogger(__name__)

GiB = 1 << 30
DEFAULT_CPU_KV_GB = 2.0


def kv_cache_dtype(setting: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type for ``INFER_KV_CACHE_DTYPE`` (auto: the model's; fp8: float8 e4m3)."""
    return FP8_KV_DTYPE if setting == "fp8" else model_dtype


def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers, K and V."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8


def cpu_num_blocks(kv_cache_gb: float | None, bytes_per_block: int, max_useful_blocks: int) -> int:
    """On the CPU: the configured GiB (default 2), never more blocks than could ever be used."""
    budget = (kv_cache_gb or DEFAULT_CPU_KV_GB) * GiB
    return max(1, min(int(budget // bytes_per_block), max_useful_blocks))


def cuda_num_blocks(utilization: float, kv_cache_gb: float | None, bytes_per_block: int, device: torch.device,
                    max_useful_blocks: int, graph_share: float = 0.0, transient: int | None = None) -> int:
    """On CUDA, after a profiling forward: what ``utilization`` of the GPU leaves for KV blocks.

    ``graph_share`` of the profiled activations is set aside for the CUDA graphs' memory pool,
    which keeps the activations of the largest captured decode batch; ``transient``: the profiled
    activations' bytes (default: the allocator's peak less what it holds now). Never more than could ever
    be used (``max_num_seqs`` full-length requests): a tiny model does not need the whole GPU.
    """
    if kv_cache_gb is not None:
        return min(int(kv_cache_gb * GiB // bytes_per_block), max_useful_blocks)
    free, total = torch.cuda.mem_get_info(device)
    if transient is None:
        transient = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    graphs = graph_share * transient
    budget = utilization * total - (total - free) - transient - graphs
    logger.info(
        "memory profile: %.2f GiB total, %.2f GiB in use after weights, %.2f GiB peak activations, "
        "%.2f GiB for CUDA graphs; %.2f GiB for KV",
        total / GiB, (total - free) / GiB, transient / GiB, graphs / GiB, max(budget, 0) / GiB,
    )
    return max(0, min(int(budget // bytes_per_block), max_useful_blocks))


def allocate_kv_caches(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device,
) -> list[torch.Tensor]:
    """One zeroed tensor per layer, ``[2, num_blocks, block_size, num_kv_heads, head_dim]``."""
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    storage = torch.zeros(shape, dtype=dtype, device=device)
    return list(storage.unbind(0))
