"""The ``torch`` attention backend: gather each request's paged K/V, then ``scaled_dot_product_attention``.

The reference implementation, and the CPU's: correct on CPU and CUDA for any dtype, head_dim and
block size, with GQA, sliding windows and a prefix already in the cache. Decode-only requests are
batched into one call (padded to the longest context and masked); prefills run one call per request.
On the CPU, where its C kernel builds (``layers/cpu_attention.py``, chosen when the backend is built), the
decode rows read the paged cache in place instead of the gather + SDPA, for a float32 or bfloat16 cache and a
head_dim multiple of 16; in a decode-only step that call stores the step's K/V too.

What does not depend on the layer is derived once per step (``build_metadata``) and shared by every
layer: the decode rows' block ids (one ``index_select`` per layer copies whole blocks, K and V
together), their key masks (additive, in the query's dtype, as SDPA turns a boolean mask into
anyway), the new tokens' cache slots as int64, and the host copies of the request boundaries.

An FP8 cache (``INFER_KV_CACHE_DTYPE=fp8``) is written through ``quantize_kv``. Read back, its keys are
the stored e4m3 values cast to the query's dtype (exact) with ``k_scale`` folded into the softmax scale,
its values ``dequantize_kv`` with ``v_scale``: the reference the Triton kernels match. Rounding
``stored * k_scale`` to bfloat16 instead would move each score by up to 2^-9 * scale * sum_i |q_i k_i|
(a relative error of each key, not of the score): at keys near the e4m3 range (|k| up to 448 * k_scale)
that is a large fraction of a logit, and near-tied scores then trade softmax weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from infer_core.interfaces import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionLayer,
    BatchMetadata,
)
from infer_core.layers import cpu_attention
from infer_core.layers.kv_write import FP8_KV_DTYPE, dequantize_kv, write_kv

CAPABILITIES = AttentionCapabilities(kv_cache_dtypes=("auto", "fp8"))


def _key_mask(query_pos: torch.Tensor, num_keys: int, seq_len: torch.Tensor | int, window: int | None) -> torch.Tensor:
    """[..., q, keys] True where a query at ``query_pos`` may attend key position t.

    ``seq_len`` is an int or a tensor already shaped to broadcast against ``[..., q, keys]``.
    """
    t = torch.arange(num_keys, device=query_pos.device)
    mask = (t <= query_pos.unsqueeze(-1)) & (t < seq_len)
    if window is not None:
        mask &= t > query_pos.unsqueeze(-1) - window
    return mask


@dataclass(slots=True)
class TorchAttentionMetadata:
    """One step's common metadata and what every layer's attention derives from it alike."""

    common: BatchMetadata
    starts: list[int]  # query_start_loc on the host
    seq_lens: list[int]  # seq_lens on the host
    num_decodes: int
    decode_blocks: torch.Tensor | None  # [num_decodes * blocks] block ids of the decode rows, row by row
    decode_keys: int  # keys per decode row after the gather (blocks * block_size)
    slots: torch.Tensor  # int64 [num_tokens]: the cache slot of each new token
    # [num_decodes, 1, 1, keys] additive key masks of the decode rows (0 or -inf), by sliding window (None: no
    # window) and dtype; made on first use
    decode_masks: dict[tuple[int | None, torch.dtype], torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return self.common.num_tokens

    @property
    def slot_mapping(self) -> torch.Tensor:
        return self.common.slot_mapping

    def decode_mask(self, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        mask = self.decode_masks.get((window, dtype))
        if mask is None:
            seq_lens = self.common.seq_lens[: self.num_decodes]
            allowed = _key_mask((seq_lens - 1).unsqueeze(-1), self.decode_keys, seq_lens[:, None, None], window)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
            mask = self.decode_masks[(window, dtype)] = mask.unsqueeze(1)
        return mask


def _score_scale(layer: AttentionLayer, kv_cache: torch.Tensor) -> float:
    """The softmax scale of the scores against the cache's keys: ``k_scale`` folded in for an FP8 cache,
    whose keys are read unscaled (exact in any float dtype), as the Triton kernels do."""
    return layer.scale * layer.k_scale if kv_cache.dtype == FP8_KV_DTYPE else layer.scale


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # On the CPU, decode rows read the paged cache in place (layers/cpu_attention.py) where its kernel builds
        self.cpu_kernel = cpu_attention.load() if ctx.device == "cpu" and ctx.dtype in ("float32", "bfloat16") else None

    @classmethod
    def capabilities(cls, ctx) -> AttentionCapabilities:
        return CAPABILITIES

    def build_metadata(self, common: BatchMetadata) -> TorchAttentionMetadata:
        num_decodes = common.num_decode_only
        seq_lens = common.seq_lens_cpu[: common.num_reqs].tolist()
        blocks, keys = None, 0
        if num_decodes:
            num_blocks = -(-max(seq_lens[:num_decodes]) // common.block_size)
            blocks = common.block_tables[:num_decodes, :num_blocks].reshape(-1)
            keys = num_blocks * common.block_size
        return TorchAttentionMetadata(common, common.query_start_loc_cpu[: common.num_reqs + 1].tolist(), seq_lens,
                                      num_decodes, blocks, keys, common.slot_mapping[: common.num_tokens].long())

    def standard_kv_slot_mapping(self, metadata: TorchAttentionMetadata) -> torch.Tensor:
        return metadata.slot_mapping[: metadata.num_tokens]

    def forward(self, layer: AttentionLayer, q, k, v, kv_cache, metadata: TorchAttentionMetadata, *,
                kv_written: bool = False):
        if isinstance(metadata, BatchMetadata):  # called without build_metadata (a test, a plugin's reference)
            metadata = self.build_metadata(metadata)
        n = metadata.num_tokens  # rows past it are padding (never written)
        num_decodes, num_reqs = metadata.num_decodes, metadata.common.num_reqs
        if (not kv_written and num_decodes == num_reqs == n == q.shape[0]
                and self._reads_in_place(q, kv_cache, layer)):  # decode only: the kernel stores k and v too
            return self._paged_decode(layer, q, kv_cache, metadata, (k, v, metadata.slots))
        if not kv_written:
            write_kv(kv_cache, k[:n], v[:n], metadata.slots, layer.k_scale, layer.v_scale)
        if num_decodes == num_reqs and num_decodes == q.shape[0]:  # decode only, unpadded: no copy into `out`
            return self._decode(layer, q, kv_cache, metadata)
        out = torch.zeros_like(q)
        if num_decodes:
            out[:num_decodes] = self._decode(layer, q[:num_decodes], kv_cache, metadata)
        starts, block_tables = metadata.starts, metadata.common.block_tables
        for i in range(num_decodes, num_reqs):
            start, end = starts[i], starts[i + 1]
            out[start:end] = self._prefill(layer, q[start:end], kv_cache, block_tables[i], metadata.seq_lens[i])
        return out

    def _reads_in_place(self, q: torch.Tensor, kv_cache: torch.Tensor, layer: AttentionLayer) -> bool:
        return self.cpu_kernel is not None and cpu_attention.supports(q.dtype, kv_cache, layer.head_dim)

    def _paged_decode(self, layer, q, kv_cache, md: TorchAttentionMetadata, new_kv):
        """The decode rows by the CPU kernel, reading the paged cache in place (storing ``new_kv`` first)."""
        rows = md.num_decodes
        return cpu_attention.decode_attention(self.cpu_kernel, q, kv_cache, md.common.block_tables[:rows],
                                              md.common.seq_lens[:rows], md.decode_keys,
                                              _score_scale(layer, kv_cache), layer.sliding_window, new_kv)

    @staticmethod
    def _gather(kv_cache: torch.Tensor, blocks: torch.Tensor, layer: AttentionLayer, dtype: torch.dtype):
        """K and V of the blocks ``blocks`` [R * b] names: each [R * b * block_size, kv_heads, head_dim], in ``dtype``.

        From an FP8 cache, K is the stored values unscaled (``_score_scale`` carries ``k_scale``), V is
        ``stored * v_scale``.

        ``index_select`` copies whole blocks, K and V in one call (advanced indexing copies element by element).
        """
        if kv_cache.dtype == FP8_KV_DTYPE:  # its bytes gathered through a uint8 view (any device has that kernel)
            kv = kv_cache.view(torch.uint8).index_select(1, blocks).view(FP8_KV_DTYPE)
            k, v = kv[0].flatten(0, 1), kv[1].flatten(0, 1)
            return k.to(dtype), dequantize_kv(v, layer.v_scale, dtype)
        kv = kv_cache.index_select(1, blocks)
        return kv[0].flatten(0, 1), kv[1].flatten(0, 1)

    def _decode(self, layer, q, kv_cache, md: TorchAttentionMetadata):
        num_decodes = md.num_decodes
        if self._reads_in_place(q, kv_cache, layer):
            return self._paged_decode(layer, q, kv_cache, md, None)
        k, v = self._gather(kv_cache, md.decode_blocks, layer, q.dtype)
        k, v = k.view(num_decodes, md.decode_keys, *k.shape[1:]), v.view(num_decodes, md.decode_keys, *v.shape[1:])
        # q [R, 1, H, D] -> [R, H, 1, D]; k/v [R, S, Hk, D] -> [R, Hk, S, D]
        o = F.scaled_dot_product_attention(
            q.unsqueeze(1).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=md.decode_mask(layer.sliding_window, q.dtype), scale=_score_scale(layer, kv_cache),
            enable_gqa=layer.num_heads != layer.num_kv_heads,
        )
        return o.transpose(1, 2).squeeze(1)

    def _prefill(self, layer, q, kv_cache, block_table, seq_len: int):
        block_size = kv_cache.shape[2]
        query_len = q.shape[0]
        k, v = self._gather(kv_cache, block_table[: -(-seq_len // block_size)], layer, q.dtype)
        # [1, heads, tokens, head_dim]: SDPA's flash and memory-efficient kernels take only 4-D
        # inputs, and not enable_gqa, so the KV heads are expanded; otherwise it falls back to the
        # math kernel, which materialises [heads, queries, keys] scores (9 GB for an 8k prompt).
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k[:seq_len], v[:seq_len]))
        if layer.num_heads != layer.num_kv_heads:
            group = layer.num_heads // layer.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if query_len == seq_len and layer.sliding_window is None:  # a whole prompt: plain causal
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=_score_scale(layer, kv_cache))
        else:
            query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            mask = _key_mask(query_pos, seq_len, seq_len, layer.sliding_window)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=_score_scale(layer, kv_cache))
        return o[0].transpose(0, 1)
