"""The decode kernel's run-time choices compiled at start (``TritonAttentionBackend.warm_up``)."""

from __future__ import annotations

import torch
from infer_core.interfaces import AttentionLayer

from infer_attention_triton.decode import decode_attention
from infer_attention_triton.split_merge import SplitScratch
from infer_attention_triton.tiles import DecodeTiles


def warm_up_decode(layer: AttentionLayer, kv_cache: torch.Tensor, block_tables: torch.Tensor, dtype: torch.dtype,
                   tiles: DecodeTiles, max_splits: int) -> None:
    """Compile the decode kernel's variants a step may choose, for ``layer`` on its cache, before any request.

    A step's split count (a power of two up to ``max_splits``) and whether it orders its requests are compile-time
    choices; CUDA-graph capture compiles those of its batch sizes at ``max_model_len``, but an eager step (decodes
    beside a prompt chunk) picks them from its own lengths. Each pair runs here once on one request of one key, in
    block 0, through a table row shaped like ``block_tables``' (the runner's buffer: the same row stride); nothing
    is written but this function's own outputs. The query is a view into a wider qkv row, as the layers pass it.
    """
    device = kv_cache.device
    heads, kv_heads, dim = layer.num_heads, layer.num_kv_heads, layer.head_dim
    qkv = torch.zeros(1, (heads + 2 * kv_heads) * dim, dtype=dtype, device=device)
    q = qkv[:, : heads * dim].view(1, heads, dim)
    out = torch.empty(1, heads, dim, dtype=dtype, device=device)
    table = torch.zeros_like(block_tables[:1])
    seq_lens = torch.ones(1, dtype=torch.int32, device=device)
    order = torch.zeros(1, dtype=torch.int32, device=device)
    num_splits = 1
    while num_splits <= max_splits:
        scratch = SplitScratch.allocate(1, heads, num_splits, dim, device) if num_splits > 1 else None
        for req_order in (None, order):
            decode_attention(q, kv_cache, table, seq_lens, out, scale=layer.scale, num_splits=num_splits,
                             tiles=tiles, sliding_window=layer.sliding_window, scratch=scratch, req_order=req_order,
                             k_scale=layer.k_scale, v_scale=layer.v_scale)
        num_splits *= 2
