"""Piecewise CUDA graphs: a step no whole-step graph holds runs the model's layers as graph replays, and only
its attention from Python.

A step of several requests' prompt chunks (or prompts beside decodes) has no graph of its own: the attention's
launch grid follows the requests' lengths, which change every step. Run eagerly, such a step is hundreds of
launches from Python, and for a small model the host spends longer issuing them than the GPU computing them
(a 16 x 512-token prefill of Qwen3-0.6B: ~30 ms of host time for ~12 ms of GPU work). Everything between two
attentions depends only on the step's token count, so it is captured once per size: the model's forward is
captured with each layer's call into the attention backend as a cut. The graph before the first cut holds the
embedding and the first layer up to its attention (its k and v stored in the cache where the layer fuses that
store), each graph after a cut the rest of a layer and the next one up to its attention, and the last the final
norm. A replay runs graph 0, attention 0 (from Python, on the step's real lengths), graph 1, ... and returns the
hidden states; the runner computes the sampled rows' logits from them.

A step of ``n`` tokens is padded to the next captured size with tokens of no request that write only the pad KV
block (as a prefill graph's padding); the attention ignores rows past ``n``. The attention writes its output
into one buffer every layer shares (the next graph reads it from there). The tensors a cut hands to the
attention (q, k, v) live in the graphs' memory pool; the pieces keep views that do not own that memory, so a
later piece may reuse it: at replay it runs after the attention has read them. Replays must therefore follow
capture order within a size, and the hidden states returned hold only until the next replay.
"""

from __future__ import annotations

import bisect
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from infer_core.layers.attention import Attention
from infer_core.layers.graph_capture import piecewise_capture

logger = logging.getLogger(__name__)

# dtype width -> a typestr of that width (the views reinterpret the bytes as the tensor's own dtype)
_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}


def piecewise_sizes(max_tokens: int) -> list[int]:
    """Token counts captured: 16 ... 256 by doubling, then every 256 up to 2048, then every 512, and
    ``max_tokens`` itself: a step pads by at most 256 tokens up to 2048, 512 beyond (where the GPU's work
    grows with the tokens, that is at most a few percent of it)."""
    sizes = [s for s in (16, 32, 64, 128) if s < max_tokens]
    step, size = 256, 256
    while size < max_tokens:
        sizes.append(size)
        size += step if size < 2048 else 512
    return sizes + [max_tokens]


class _Unowned:
    """A CUDA array interface over a tensor's memory that does not keep that memory allocated."""

    def __init__(self, tensor: torch.Tensor) -> None:
        size = tensor.element_size()
        self.__cuda_array_interface__ = {
            "shape": tuple(tensor.shape), "strides": tuple(s * size for s in tensor.stride()),
            "typestr": _TYPESTR[size], "data": (tensor.data_ptr(), False), "version": 3,
        }


def unowned_view(tensor: torch.Tensor) -> torch.Tensor:
    """A view of ``tensor``'s memory that does not own it: freeing ``tensor`` returns the memory to its pool."""
    return torch.as_tensor(_Unowned(tensor), device=tensor.device).view(tensor.dtype)


@dataclass(slots=True)
class _AttentionCall:
    """One cut: the layer's attention, on the tensors its graph leaves (views into the graphs' pool)."""

    backend: Any
    layer: Any
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor
    kv_written: bool
    out: torch.Tensor  # a view of the shared output buffer, read by the next graph
    takes_out: bool  # the backend writes into ``out`` itself (else its result is copied there)

    def run(self, metadata: Any) -> torch.Tensor:
        if self.takes_out:
            return self.backend.forward(self.layer, self.q, self.k, self.v, self.kv_cache, metadata,
                                        kv_written=self.kv_written, out=self.out)
        result = self.backend.forward(self.layer, self.q, self.k, self.v, self.kv_cache, metadata,
                                      kv_written=self.kv_written)
        return self.out.copy_(result)


@dataclass(slots=True)
class _Pieces:
    graphs: list[torch.cuda.CUDAGraph]
    calls: list[_AttentionCall]
    hidden: torch.Tensor  # the last graph's output (an unowned view)


class _Cutter:
    """Stands in for the attention backend while a size is captured: ends the graph being captured, runs the
    attention on the capture's stream, records the call and starts the next graph."""

    def __init__(self, backend: Any, pieces: _Pieces, pool: Any, out: torch.Tensor) -> None:
        self.backend = backend
        self.pieces = pieces
        self.pool = pool
        self.out = out  # flat, every layer's output shares it
        self.takes_out = "out" in inspect.signature(backend.forward).parameters

    def standard_kv_slot_mapping(self, metadata: Any) -> torch.Tensor | None:
        return self.backend.standard_kv_slot_mapping(metadata)

    def forward(self, layer, q, k, v, kv_cache, metadata, *, kv_written: bool = False) -> torch.Tensor:
        self.pieces.graphs[-1].capture_end()
        out = self.out[: q.numel()].view(q.shape)
        call = _AttentionCall(self.backend, layer, unowned_view(q), unowned_view(k), unowned_view(v), kv_cache,
                              kv_written, out, self.takes_out)
        call.run(metadata)
        self.pieces.calls.append(call)
        graph = torch.cuda.CUDAGraph()
        self.pieces.graphs.append(graph)
        graph.capture_begin(pool=self.pool)
        return out


def attention_sites(model: torch.nn.Module) -> list[Attention]:
    """Every ``Attention`` the model's modules hold, in module order."""
    return [value for module in model.modules() for value in vars(module).values() if isinstance(value, Attention)]


class PiecewiseGraphs:
    """The pieces of every captured size; ``replay`` runs a step padded to one of them."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.captured: dict[int, _Pieces] = {}
        self.pool_bytes = 0

    def padded_size(self, num_tokens: int) -> int | None:
        """The smallest captured size that holds ``num_tokens`` tokens (None: run eagerly)."""
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) and self.sizes[i] in self.captured else None

    def capture(self, model: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata_for: Callable[[int], Any], dtype: torch.dtype) -> None:
        """Capture every size, largest first, into one memory pool of their own. ``input_ids``/``positions``
        are the persistent buffers the steps are written into; ``metadata_for(size)`` the attention
        metadata of one request of ``size`` tokens on the pad block (for the warm-up and the capture);
        ``dtype`` the activations'."""
        sites = attention_sites(model)
        if not sites:
            raise RuntimeError(f"{type(model).__name__} calls no Attention layer: nothing to cut piecewise graphs at")
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        width = max(site.layer.num_heads * site.layer.head_dim for site in sites)
        out = torch.empty(max(self.sizes) * width, dtype=dtype, device=input_ids.device)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        backends = [site.backend for site in sites]
        try:
            with torch.cuda.stream(stream), piecewise_capture():
                for size in sorted(self.sizes, reverse=True):
                    metadata = metadata_for(size)
                    model(input_ids[:size], positions[:size], kv_caches, metadata)  # warm-up: compiles, workspaces
                    pieces = _Pieces([torch.cuda.CUDAGraph()], [], out)
                    for site, backend in zip(sites, backends):
                        site.backend = _Cutter(backend, pieces, pool, out)
                    pieces.graphs[0].capture_begin(pool=pool)
                    try:
                        hidden = model(input_ids[:size], positions[:size], kv_caches, metadata)
                    except Exception as e:
                        _end_failed_capture(pieces.graphs[-1])
                        raise RuntimeError(f"capturing the piecewise CUDA graphs of {size}-token steps failed "
                                           f"({type(e).__name__}: {e}); piecewise_cuda_graphs=false "
                                           f"(INFER_PIECEWISE_CUDA_GRAPHS=0) runs such steps eagerly") from e
                    pieces.graphs[-1].capture_end()
                    pieces.hidden = unowned_view(hidden)
                    del hidden  # its memory is the pool's again: the next size may reuse it
                    for site, backend in zip(sites, backends):
                        site.backend = backend
                    self.captured[size] = pieces
        finally:
            for site, backend in zip(sites, backends):
                site.backend = backend
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.pool_bytes = free_before - torch.cuda.mem_get_info()[0]
        logger.info("captured piecewise CUDA graphs for steps of %d-%d tokens (%d sizes, %d graphs each) in %.1f s, "
                    "%.0f MiB", self.sizes[0], self.sizes[-1], len(self.sizes), len(sites) + 1,
                    time.perf_counter() - start, self.pool_bytes / 2**20)

    def replay(self, size: int, metadata: Any) -> torch.Tensor:
        """The model's hidden states ``[size, hidden]`` for the step in the buffers (padded to ``size``), its
        attention run on ``metadata``; they hold until the next replay of any size."""
        pieces = self.captured[size]
        graphs, calls = pieces.graphs, pieces.calls
        for graph, call in zip(graphs, calls):
            graph.replay()
            call.run(metadata)
        graphs[-1].replay()
        return pieces.hidden


def _end_failed_capture(graph: torch.cuda.CUDAGraph) -> None:
    """Take the stream out of capture after a failure inside it (a graph left capturing aborts the process when
    collected); the capture's own error, if it has one, adds nothing to the failure being raised."""
    try:
        graph.capture_end()
    except Exception:  # noqa: BLE001 - the capture was already invalid
        pass
