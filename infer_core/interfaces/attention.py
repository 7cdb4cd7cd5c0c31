"""Attention backends: paged attention over the flat batch of one step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infer_core.interfaces.context import RuntimeComponent, RuntimeContext

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class AttentionCapabilities:
    """What a backend supports; the loader negotiates the KV block size from this."""

    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    head_dims: tuple[int, ...] | None = None  # None: any head_dim
    block_size_multiple: int = 1
    default_block_size: int = 16
    supports_sliding_window: bool = True
    supports_cuda_graphs: bool = False
    # One request's prompt chunk replayed from a graph captured at a larger token count: the prefill
    # launch must take its grid from max_query_len alone and read the request's lengths on the device.
    supports_prefill_cuda_graphs: bool = False
    # The KV cache element types it reads and writes (``INFER_KV_CACHE_DTYPE``): "auto" is the model's
    # dtype; "fp8" is float8 e4m3 holding value / scale, with the layer's ``k_scale``/``v_scale``.
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    # Each request's lengths are read from BatchMetadata's device tensors, the host copies (max_seq_len,
    # seq_lens_cpu) taken as upper bounds only: a step planned over a verify step still running may then be moved
    # back on the device by the drafts it rejected (runner/accepted_drafts.py) without the host knowing how far.
    reads_device_lengths: bool = False


@dataclass(frozen=True, slots=True)
class AttentionLayer:
    """The static description of one attention layer, passed to every ``forward`` call."""

    layer_idx: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank
    head_dim: int
    scale: float
    sliding_window: int | None = None  # keys older than this many positions are not attended
    # An FP8 KV cache stores k / k_scale and v / v_scale (clamped to the e4m3 range) and reads back
    # stored * scale; per-layer constants (from the checkpoint, else 1.0), unused by a cache in the model's dtype.
    k_scale: float = 1.0
    v_scale: float = 1.0


@dataclass(slots=True)
class BatchMetadata:
    """The step's batch in the form every attention kernel needs; built once per step.

    Requests are ordered decode-only first: requests ``[0, num_decode_only)`` have exactly one
    query token. Device tensors live on the model's device; ``*_cpu`` twins let host-side code
    read lengths without a device sync.
    """

    num_reqs: int
    num_tokens: int  # real tokens this step (the flat batch may be padded beyond this)
    num_decode_only: int
    max_query_len: int
    max_seq_len: int
    block_size: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1], cu_seqlens of the queries
    seq_lens: torch.Tensor  # int32 [num_reqs], tokens in the cache after this step
    block_tables: torch.Tensor  # int32 [num_reqs, max_blocks_per_req]
    slot_mapping: torch.Tensor  # int32 [num_tokens], cache slot of each new token (-1: skip)
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    # int32 [num_decode_only]: the decode-only requests longest context first. A backend may launch
    # its decode programs in this order so the longest start first and short ones fill the tail
    # (a ragged batch otherwise ends on a few long programs). None: batch order.
    decode_order: torch.Tensor | None = None

    @property
    def context_lens_cpu(self) -> torch.Tensor:
        """Tokens already in the cache before this step, per request."""
        query_lens = self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]
        return self.seq_lens_cpu - query_lens


def kv_cache_dtype_reasons(caps: AttentionCapabilities, ctx: RuntimeContext) -> list[str]:
    """Why a backend of ``caps`` cannot hold the KV cache ``INFER_KV_CACHE_DTYPE`` asks for; empty when it can."""
    wanted = ctx.settings.kv_cache_dtype
    if wanted in caps.kv_cache_dtypes:
        return []
    supported = ", ".join(caps.kv_cache_dtypes)
    return [f"KV cache dtype {wanted} (INFER_KV_CACHE_DTYPE) is not supported (supported: {supported})"]


class AttentionBackend(RuntimeComponent, ABC):
    """One implementation of paged attention.

    Lifecycle: ``validate(ctx)`` (class method, may not import heavy dependencies), then
    ``cls(ctx)``, ``bind_layers`` once the model is built; each step ``build_metadata(common)`` once, then
    ``forward`` once per layer.
    The KV cache of one layer is ``[2, num_blocks, block_size, num_kv_heads, head_dim]``.

    Who writes the step's new K/V: the backend, inside ``forward``, unless its cache has the
    standard paged layout and it says so (``standard_kv_slot_mapping``); then a model layer may
    store k/v itself in a kernel it runs anyway (Qwen3's q/k-norm + rotary) and call
    ``forward(..., kv_written=True)``, saving one launch per layer.
    """

    @classmethod
    def capabilities(cls, ctx: RuntimeContext) -> AttentionCapabilities:
        return AttentionCapabilities()

    @classmethod
    def validate(cls, ctx: RuntimeContext) -> list[str]:
        """Reasons this backend cannot run for ``ctx``; empty when it can."""
        caps = cls.capabilities(ctx)
        reasons = []
        if ctx.dtype not in caps.dtypes:
            reasons.append(f"dtype {ctx.dtype} is not supported (supported: {', '.join(caps.dtypes)})")
        if caps.head_dims is not None and ctx.model.head_dim not in caps.head_dims:
            supported = ", ".join(map(str, caps.head_dims))
            reasons.append(f"head_dim {ctx.model.head_dim} is not supported (supported: {supported})")
        if any(ctx.model.sliding_windows) and not caps.supports_sliding_window:
            reasons.append("sliding-window attention is not supported")
        reasons += kv_cache_dtype_reasons(caps, ctx)
        return reasons

    def bind_layers(self, layers: Sequence[AttentionLayer]) -> None:
        """The model's attention layers as built on this rank (their heads this rank's share of the model's),
        given once its weights are loaded, before any step: what a backend sizes its launches by where ``ctx``
        (the whole model) would mislead it. The default keeps nothing."""

    def build_metadata(self, common: BatchMetadata) -> Any:
        """Derive backend-specific metadata once per step (default: use the common one)."""
        return common

    def standard_kv_slot_mapping(self, metadata: Any) -> torch.Tensor | None:
        """The step's ``slot_mapping`` when a layer may store its new k/v rows in the cache itself, else None.

        A backend returns it only if its cache is the standard paged layout ``[2, num_blocks,
        block_size, num_kv_heads, head_dim]`` (slot ``s`` is row ``s % block_size`` of block
        ``s // block_size``; slot -1 is not stored; rows of the flat batch past ``slot_mapping``
        are padding, not stored) and its ``forward`` honours ``kv_written``. The default, None,
        keeps the write in ``forward``: a plugin with another layout need not change anything.
        """
        return None

    def warm_up(self, layers: Sequence[AttentionLayer], kv_caches: Sequence[torch.Tensor],
                block_tables: torch.Tensor, dtype: torch.dtype) -> None:
        """Compile, before the first request, the kernels a step may choose at run time that start-up's dummy
        steps and graph captures do not reach (a kernel compiled mid-run stalls every request in the step).

        ``layers`` and ``kv_caches`` are the model's, in order; ``block_tables`` the runner's buffer the steps'
        block tables are rows of; ``dtype`` the activations'. The default compiles nothing.
        """

    @abstractmethod
    def forward(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,
        metadata: Any,
        *,
        kv_written: bool = False,
    ) -> torch.Tensor:
        """Write k/v into ``kv_cache`` at ``slot_mapping`` and return ``[num_tokens, num_heads, head_dim]``.

        ``kv_written=True``: the caller has already stored k and v of these tokens at the slots
        ``standard_kv_slot_mapping`` gave, so ``forward`` does not write them again. Callers pass it
        only to a backend whose ``standard_kv_slot_mapping`` is not None.

        A backend whose ``forward`` also takes ``out`` (a tensor shaped like ``q``) writes the result
        there (rows past the step's tokens may hold anything) and returns it: piecewise CUDA graphs
        (runner/piecewise_graphs.py) pass the buffer the next graph reads; without it they copy.
        """
