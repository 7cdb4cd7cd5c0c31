"""Random paged batches and a float64 reference, for this plugin's tests and the benchmark.

A batch is described by each request's context length (tokens already cached) and query length
(new tokens this step); blocks are handed out in a shuffled order, so a request's pages are
scattered through the cache as they are in a running engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from infer_core.interfaces import BatchMetadata


@dataclass(slots=True)
class PagedBatch:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor  # [num_tokens, num_kv_heads, head_dim], the new tokens' keys
    v: torch.Tensor
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim], context already written
    metadata: BatchMetadata
    context_lens: list[int]
    query_lens: list[int]


def make_paged_batch(
    context_lens: list[int],
    query_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedBatch:
    """Requests must come decode-only first (query length 1), as the runner orders them."""
    gen = torch.Generator(device="cpu").manual_seed(seed)  # the page order
    values = torch.Generator(device=device).manual_seed(seed)  # K, V, Q drawn where they live
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_req)
    block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_req):
        block_tables[i, :n] = torch.tensor(order[used : used + n], dtype=torch.int32)
        used += n

    def randn(*shape):
        return torch.randn(*shape, generator=values, dtype=torch.float32, device=device).to(dtype)

    kv_cache = randn(2, num_blocks, block_size, num_kv_heads, head_dim)  # garbage outside the contexts
    slots = []
    for i, (c, q) in enumerate(zip(context_lens, query_lens)):
        positions = torch.arange(c + q)
        req_slots = (block_tables[i, positions // block_size].long() * block_size + positions % block_size).to(device)
        kv_cache[0].view(-1, num_kv_heads, head_dim)[req_slots[:c]] = randn(c, num_kv_heads, head_dim)
        kv_cache[1].view(-1, num_kv_heads, head_dim)[req_slots[:c]] = randn(c, num_kv_heads, head_dim)
        slots.append(req_slots[c:].cpu())
    num_tokens = sum(query_lens)
    query_start_loc = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    num_decode_only = 0
    while num_decode_only < len(query_lens) and query_lens[num_decode_only] == 1:
        num_decode_only += 1
    if any(q == 1 for q in query_lens[num_decode_only:]):
        raise ValueError("put decode-only requests (query length 1) first")
    metadata = BatchMetadata(
        num_reqs=len(seq_lens),
        num_tokens=num_tokens,
        num_decode_only=num_decode_only,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=block_size,
        query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens_t.to(device),
        block_tables=block_tables.to(device),
        slot_mapping=torch.cat(slots).to(torch.int32).to(device),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
    )
    return PagedBatch(
        q=randn(num_tokens, num_heads, head_dim),
        k=randn(num_tokens, num_kv_heads, head_dim),
        v=randn(num_tokens, num_kv_heads, head_dim),
        kv_cache=kv_cache,
        metadata=metadata,
        context_lens=list(context_lens),
        query_lens=list(query_lens),
    )


def write_new_tokens(batch: PagedBatch) -> None:
    """Put the new tokens' K/V into the cache with plain indexing (what the kernels then read)."""
    slots = batch.metadata.slot_mapping.long()
    num_kv_heads, head_dim = batch.kv_cache.shape[-2:]
    batch.kv_cache[0].view(-1, num_kv_heads, head_dim)[slots] = batch.k
    batch.kv_cache[1].view(-1, num_kv_heads, head_dim)[slots] = batch.v


def reference_attention(
    batch: PagedBatch, scale: float, sliding_window: int | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Causal attention of every new token over its request's cache, computed in ``dtype`` (float64)."""
    md = batch.metadata
    kv = batch.kv_cache.to(dtype)
    block_size, num_kv_heads, head_dim = kv.shape[2:]
    num_heads = batch.q.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros(batch.q.shape, dtype=dtype, device=batch.q.device)
    starts = md.query_start_loc_cpu.tolist()
    for i, (c, n) in enumerate(zip(batch.context_lens, batch.query_lens)):
        seq_len = c + n
        positions = torch.arange(seq_len, device=kv.device)
        rows = md.block_tables[i, positions // block_size].long() * block_size + positions % block_size
        k = kv[0].reshape(-1, num_kv_heads, head_dim)[rows].repeat_interleave(group, 1)  # [S, H, D]
        v = kv[1].reshape(-1, num_kv_heads, head_dim)[rows].repeat_interleave(group, 1)
        q = batch.q[starts[i] : starts[i + 1]].to(dtype)  # [n, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        query_pos = torch.arange(c, seq_len, device=kv.device)[:, None]
        visible = positions[None, :] <= query_pos
        if sliding_window is not None:
            visible &= positions[None, :] > query_pos - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[starts[i] : starts[i + 1]] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest per-token ||got - expected|| / ||expected|| (tokens scored one by one, so none hides)."""
    got, expected = got.double().flatten(1), expected.double().flatten(1)
    return float(((got - expected).norm(dim=1) / expected.norm(dim=1)).max())
