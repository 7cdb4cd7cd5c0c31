"""The ``triton`` attention backend: KV write, then one decode and one prefill/extend launch per layer.

The KV write is the core's kernel (``infer_core.layers.fused.kv_write``, which the flash backend
uses too); it is skipped when the layer stored k/v itself (``forward(..., kv_written=True)``). An FP8
cache (``INFER_KV_CACHE_DTYPE=fp8``) is written and read with the layer's ``k_scale``/``v_scale``.

Requests come decode-only first (``BatchMetadata.num_decode_only``), so a mixed step is a
split-K decode launch over requests ``[0, num_decode_only)`` and a prefill launch over the rest.
Host-side choices (split count, scratch for the partials) are made in ``build_metadata``, once
per step; ``forward`` only launches kernels: no host sync, no lengths read back from the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from infer_core.interfaces import AttentionBackend, AttentionCapabilities, AttentionLayer, BatchMetadata, RuntimeContext
from infer_core.layers.fused.kv_write import write_kv

from infer_attention_triton.capabilities import CAPABILITIES, validate_context
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.prefill import prefill_attention
from infer_attention_triton.tiles import (
    FP8_PROGRAMS_PER_SM,
    MAX_SPLITS,
    PROGRAMS_PER_SM,
    PrefillTiles,
    choose_num_splits,
    decode_tiles,
    prefill_tiles,
)
from infer_attention_triton.warmup import warm_up_decode

WAVES_BEFORE_ORDER = 2  # decode programs per SM above which they launch longest context first


@dataclass(slots=True)
class TritonMetadata:
    """The common metadata plus this backend's per-step launch choices."""

    common: BatchMetadata
    num_splits: int  # split-K factor of the decode launch
    scratch: SplitScratch | None  # partials of split-K decode (None when num_splits == 1)
    prefill_tiles: PrefillTiles


def multiprocessor_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few "SMs", so small CPU batches still take the split-K path


class TritonAttentionBackend(AttentionBackend):
    @classmethod
    def capabilities(cls, ctx: RuntimeContext) -> AttentionCapabilities:
        return CAPABILITIES

    @classmethod
    def validate(cls, ctx: RuntimeContext) -> list[str]:
        return validate_context(ctx)

    def __init__(self, ctx: RuntimeContext) -> None:
        super().__init__(ctx)
        # Query heads of the whole model: an upper bound for the heads on any rank.
        self.num_heads = ctx.model.num_heads
        self.num_kv_heads = ctx.model.num_kv_heads  # this rank's, once the layers are bound
        self.head_dim = ctx.model.head_dim
        self.kv_fp8 = ctx.settings.kv_cache_dtype == "fp8"
        self.decode_tiles = decode_tiles(self.head_dim, kv_fp8=self.kv_fp8)
        self._scratch: SplitScratch | None = None
        self._num_sms: int | None = None

    def bind_layers(self, layers: Sequence[AttentionLayer]) -> None:
        """The decode grid is a program per (request, KV head, split): its split count is chosen for the KV heads
        a rank launches, half the model's over two tensor- or expert-parallel ranks."""
        if layers:
            self.num_kv_heads = max(layer.num_kv_heads for layer in layers)

    def build_metadata(self, common: BatchMetadata) -> TritonMetadata:
        """Pick the decode split count from the batch and context length; grow scratch if needed.

        For CUDA-graph capture, build the captured batch's metadata with ``max_seq_len`` set to
        the longest context the graph will see (``max_model_len``): the split count, and so the
        launch grid, then depends only on the batch size.
        """
        num_decodes = common.num_decode_only
        tiles = prefill_tiles(self.head_dim, common.block_size, self.kv_fp8)
        if num_decodes == 0:
            return TritonMetadata(common, 1, None, tiles)
        device = common.seq_lens.device
        if self._num_sms is None:
            self._num_sms = multiprocessor_count(device)
        num_splits = choose_num_splits(
            num_decodes, self.num_kv_heads, common.max_seq_len, self._num_sms, self.decode_tiles.block_n,
            FP8_PROGRAMS_PER_SM if self.kv_fp8 else PROGRAMS_PER_SM,
        )
        if num_splits == 1:
            return TritonMetadata(common, 1, None, tiles)
        if self._scratch is None or not self._scratch.fits(num_decodes, self.num_heads, num_splits, self.head_dim):
            old = self._scratch.part_out.shape if self._scratch is not None else (0, 0, 0, 0)
            self._scratch = SplitScratch.allocate(
                max(num_decodes, old[0]), self.num_heads, max(num_splits, old[2]), self.head_dim, device
            )
        return TritonMetadata(common, num_splits, self._scratch, tiles)

    def warm_up(self, layers: Sequence[AttentionLayer], kv_caches: Sequence[torch.Tensor],
                block_tables: torch.Tensor, dtype: torch.dtype) -> None:
        """The decode kernel at every split count and launch order an eager step may pick
        (``warmup.warm_up_decode``), once per kind of layer (heads, windowed or not, cache dtype: the window's size
        is a run-time argument)."""
        seen = set()
        for layer, kv_cache in zip(layers, kv_caches):
            kind = (layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.sliding_window is None, kv_cache.dtype)
            if kind not in seen and kv_cache.is_cuda:
                seen.add(kind)
                warm_up_decode(layer, kv_cache, block_tables, dtype, self.decode_tiles, MAX_SPLITS)

    def _launch_order(self, md: BatchMetadata, num_splits: int) -> torch.Tensor | None:
        """Longest context first where the decode programs run in several waves; in one wave the order
        changes nothing and its load would only delay every program."""
        num_programs = md.num_decode_only * self.num_kv_heads * num_splits
        if md.decode_order is None or num_programs <= WAVES_BEFORE_ORDER * (self._num_sms or 0):
            return None
        return md.decode_order[: md.num_decode_only]

    def standard_kv_slot_mapping(self, metadata: TritonMetadata | BatchMetadata) -> torch.Tensor:
        """The cache is the standard paged layout: a layer may store k/v and pass ``kv_written=True``."""
        md = metadata if isinstance(metadata, BatchMetadata) else metadata.common
        return md.slot_mapping[: md.num_tokens]

    def forward(self, layer: AttentionLayer, q, k, v, kv_cache, metadata: TritonMetadata | BatchMetadata, *,
                kv_written: bool = False, out: torch.Tensor | None = None):
        if isinstance(metadata, BatchMetadata):  # called without build_metadata (tests, tools)
            metadata = self.build_metadata(metadata)
        md = metadata.common
        n = md.num_tokens  # rows past it are padding: their KV is not written
        if not kv_written:  # else the layer stored k/v already (standard_kv_slot_mapping)
            write_kv(kv_cache, k[:n], v[:n], md.slot_mapping[:n], layer.k_scale, layer.v_scale)
        if out is None:
            out = torch.empty_like(q)
        num_decodes = md.num_decode_only
        if num_decodes:
            decode_attention(
                q[:num_decodes],
                kv_cache,
                md.block_tables,
                md.seq_lens,
                out,
                scale=layer.scale,
                num_splits=metadata.num_splits,
                tiles=self.decode_tiles,
                sliding_window=layer.sliding_window,
                scratch=metadata.scratch,
                req_order=self._launch_order(md, metadata.num_splits),
                k_scale=layer.k_scale,
                v_scale=layer.v_scale,
            )
        if md.num_reqs > num_decodes:
            prefill_attention(
                q,
                kv_cache,
                md.block_tables,
                md.seq_lens,
                md.query_start_loc,
                out,
                scale=layer.scale,
                first_req=num_decodes,
                num_reqs=md.num_reqs - num_decodes,
                max_query_len=md.max_query_len,
                tiles=metadata.prefill_tiles,
                sliding_window=layer.sliding_window,
                k_scale=layer.k_scale,
                v_scale=layer.v_scale,
            )
        return out
