"""The ``torch`` attention backend: gather each request's paged K/V, then ``scaled_dot_product_attention``.

The reference implementation: correct on CPU and CUDA for any dtype, head_dim and block size,
with GQA, sliding windows and a prefix already in the cache. Decode-only requests are batched
into one call (padded to the longest context and masked); prefills run one call per request.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infer_core.interfaces import AttentionBackend, AttentionLayer, BatchMetadata
from infer_core.layers.kv_write import write_kv


def _key_mask(query_pos: torch.Tensor, num_keys: int, seq_len: torch.Tensor | int, window: int | None) -> torch.Tensor:
    """[..., q, keys] True where a query at ``query_pos`` may attend key position t.

    ``seq_len`` is an int or a tensor already shaped to broadcast against ``[..., q, keys]``.
    """
    t = torch.arange(num_keys, device=query_pos.device)
    mask = (t <= query_pos.unsqueeze(-1)) & (t < seq_len)
    if window is not None:
        mask &= t > query_pos.unsqueeze(-1) - window
    return mask


class TorchAttentionBackend(AttentionBackend):
    def standard_kv_slot_mapping(self, metadata: BatchMetadata) -> torch.Tensor:
        return metadata.slot_mapping[: metadata.num_tokens]

    def forward(self, layer: AttentionLayer, q, k, v, kv_cache, metadata: BatchMetadata, *, kv_written: bool = False):
        n = metadata.num_tokens  # rows past it are padding (never written)
        if not kv_written:
            write_kv(kv_cache, k[:n], v[:n], metadata.slot_mapping[:n])
        out = torch.zeros_like(q)
        num_decodes = metadata.num_decode_only
        if num_decodes:
            out[:num_decodes] = self._decode(layer, q[:num_decodes], kv_cache, metadata, num_decodes)
        starts = metadata.query_start_loc_cpu.tolist()
        seq_lens = metadata.seq_lens_cpu.tolist()
        for i in range(num_decodes, metadata.num_reqs):
            start, end = starts[i], starts[i + 1]
            out[start:end] = self._prefill(layer, q[start:end], kv_cache, metadata.block_tables[i], seq_lens[i])
        return out

    def _gather(self, kv_cache: torch.Tensor, block_table: torch.Tensor, num_blocks: int):
        """K and V of the first ``num_blocks`` blocks: [..., num_blocks * block_size, kv_heads, head_dim]."""
        blocks = block_table[..., :num_blocks].long()
        k = kv_cache[0][blocks]
        v = kv_cache[1][blocks]
        shape = (*blocks.shape[:-1], -1, *kv_cache.shape[-2:])
        return k.reshape(shape), v.reshape(shape)

    def _decode(self, layer, q, kv_cache, md: BatchMetadata, num_decodes: int):
        block_size = kv_cache.shape[2]
        seq_lens_cpu = md.seq_lens_cpu[:num_decodes]
        max_len = int(seq_lens_cpu.max())
        k, v = self._gather(kv_cache, md.block_tables[:num_decodes], -(-max_len // block_size))
        seq_lens = md.seq_lens[:num_decodes]
        mask = _key_mask((seq_lens - 1).unsqueeze(-1), k.shape[1], seq_lens[:, None, None], layer.sliding_window)
        # q [R, 1, H, D] -> [R, H, 1, D]; k/v [R, S, Hk, D] -> [R, Hk, S, D]
        o = F.scaled_dot_product_attention(
            q.unsqueeze(1).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask.unsqueeze(1), scale=layer.scale, enable_gqa=layer.num_heads != layer.num_kv_heads,
        )
        return o.transpose(1, 2).squeeze(1)

    def _prefill(self, layer, q, kv_cache, block_table, seq_len: int):
        block_size = kv_cache.shape[2]
        query_len = q.shape[0]
        k, v = self._gather(kv_cache, block_table, -(-seq_len // block_size))
        # [1, heads, tokens, head_dim]: SDPA's flash and memory-efficient kernels take only 4-D
        # inputs, and not enable_gqa, so the KV heads are expanded; otherwise it falls back to the
        # math kernel, which materialises [heads, queries, keys] scores (9 GB for an 8k prompt).
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k[:seq_len], v[:seq_len]))
        if layer.num_heads != layer.num_kv_heads:
            group = layer.num_heads // layer.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if query_len == seq_len and layer.sliding_window is None:  # a whole prompt: plain causal
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=layer.scale)
        else:
            query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            mask = _key_mask(query_pos, seq_len, seq_len, layer.sliding_window)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=layer.scale)
        return o[0].transpose(0, 1)
