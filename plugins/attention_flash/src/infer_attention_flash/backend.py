"""The ``flash`` attention backend: flash-attn 2 reading the paged KV cache in place.

Per layer and step: one fused KV write (the core's, ``infer_core.layers.kv_write``; none when the
layer stored k/v itself, ``kv_written=True``), one ``flash_attn_with_kvcache`` call for every
one-token request, one ``flash_attn_varlen_func`` call (with ``block_table``) for every other
request. No per-request launches, no gathered copies of the cache, no host sync in ``forward``, so
a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
from infer_core.interfaces import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionLayer,
    BatchMetadata,
    PluginError,
    RuntimeContext,
)
from infer_core.layers.kv_write import choose_kv_writer

from infer_attention_flash.capabilities import CAPABILITIES, INSTALL_HINT, validate_context
from infer_attention_flash.metadata import FlashMetadata, build_flash_metadata

NO_WINDOW = (-1, -1)


def window_size(layer: AttentionLayer) -> tuple[int, int]:
    """flash-attn's ``(left, right)`` window for a layer.

    A sliding window of W keeps the query's own key and the W - 1 before it (as HF's Mistral
    does); flash-attn counts the keys to the left of the query, hence W - 1.
    """
    if layer.sliding_window is None:
        return NO_WINDOW
    return (layer.sliding_window - 1, 0)


class FlashAttentionBackend(AttentionBackend):
    @classmethod
    def capabilities(cls, ctx: RuntimeContext) -> AttentionCapabilities:
        return CAPABILITIES

    @classmethod
    def validate(cls, ctx: RuntimeContext) -> list[str]:
        return validate_context(ctx)

    def __init__(self, ctx: RuntimeContext) -> None:
        super().__init__(ctx)
        try:
            from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
        except ImportError as e:
            raise PluginError(
                f"attention 'flash' needs flash_attn, which cannot be imported ({e}); {INSTALL_HINT}"
            ) from e
        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache
        self._write_kv = choose_kv_writer(ctx.is_cuda)

    def build_metadata(self, common: BatchMetadata) -> FlashMetadata:
        return build_flash_metadata(common)

    def standard_kv_slot_mapping(self, metadata: FlashMetadata) -> torch.Tensor:
        """flash-attn's paged layout is the standard one: a layer may store k/v and pass ``kv_written=True``."""
        return metadata.common.slot_mapping[: metadata.num_tokens]

    def forward(self, layer: AttentionLayer, q, k, v, kv_cache, metadata: FlashMetadata, *, kv_written: bool = False,
                out: torch.Tensor | None = None):
        n = metadata.num_tokens  # rows past it are padding: their KV is not written
        if not kv_written:  # else the layer stored k/v already (standard_kv_slot_mapping)
            self._write_kv(kv_cache, k[:n], v[:n], metadata.common.slot_mapping[:n])
        k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, num_kv_heads, head_dim] each
        window = window_size(layer)
        decode, prefill = metadata.decode, metadata.prefill
        num_decodes = decode.num_decodes if decode is not None else 0
        if decode is not None:
            decoded = self._with_kvcache(
                q[:num_decodes].unsqueeze(1),
                k_cache,
                v_cache,
                cache_seqlens=decode.cache_seqlens,
                block_table=decode.block_table,
                softmax_scale=layer.scale,
                causal=True,
                window_size=window,
            ).squeeze(1)
            if prefill is None and num_decodes == q.shape[0] and out is None:
                return decoded  # a decode-only (or CUDA-graph) step: no copy into a second buffer
        if out is None:
            out = torch.empty_like(q)
        if decode is not None:
            out[:num_decodes] = decoded
        if prefill is not None:
            out[num_decodes:n] = self._varlen(
                q[num_decodes:n],
                k_cache,
                v_cache,
                cu_seqlens_q=prefill.cu_seqlens_q,
                cu_seqlens_k=prefill.cu_seqlens_k,
                max_seqlen_q=prefill.max_seqlen_q,
                max_seqlen_k=prefill.max_seqlen_k,
                softmax_scale=layer.scale,
                causal=True,
                window_size=window,
                block_table=prefill.block_table,
            )
        if q.shape[0] > n:
            out[n:].zero_()
        return out
