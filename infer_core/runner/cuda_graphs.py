"""CUDA graphs for decode-only steps: captured once at start, replayed instead of ~10 launches per layer.

A decode step's shapes depend only on the batch size, so one graph per size (1, 2, 4, 8, then
every 8 up to ``max_num_seqs``) covers every decode step: a batch is padded to the next captured
size with dummy one-token requests that read and write only a spare "pad" KV block. The graphs
read their inputs from the runner's persistent ``StepBuffers`` and share one memory pool
(captured largest first, so the smaller ones fit inside the largest's allocations).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from infer_core.interfaces import BatchMetadata
from infer_core.runner.inputs import StepBuffers

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to ``max_num_seqs`` (which is always included)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 8))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor | None  # [size, vocab] written by each replay; None on ranks that do not sample
    metadata: Any  # the backend's metadata for this size: kept alive, since the graph reads its tensors


class CudaGraphRunner:
    """Captures ``forward(input_ids, positions, metadata) -> logits`` per batch size and replays it."""

    def __init__(self, buffers: StepBuffers, block_size: int, max_seq_len: int, sizes: list[int]) -> None:
        self.buffers = buffers
        self.block_size = block_size
        self.max_seq_len = max_seq_len  # the captured metadata serves any context up to this
        self.sizes = sizes
        self.graphs: dict[int, _Graph] = {}

    def padded_size(self, num_reqs: int) -> int | None:
        """The smallest captured size that holds ``num_reqs`` requests (None: run eagerly)."""
        i = bisect.bisect_left(self.sizes, num_reqs)
        return self.sizes[i] if i < len(self.sizes) and self.sizes[i] in self.graphs else None

    def _metadata(self, size: int) -> BatchMetadata:
        """Decode-only metadata over the first ``size`` rows of the persistent buffers."""
        b = self.buffers
        b.fill_padding(0, size, 0, size, self.block_size)
        b.copy_to_device(size, b.max_blocks_per_req)
        return BatchMetadata(
            num_reqs=size, num_tokens=size, num_decode_only=size, max_query_len=1, max_seq_len=self.max_seq_len,
            block_size=self.block_size,
            query_start_loc=b.dev["query_start_loc"][: size + 1],
            seq_lens=b.dev["seq_lens"][:size],
            block_tables=b.block_tables[:size],
            slot_mapping=b.dev["slot_mapping"][:size],
            query_start_loc_cpu=torch.arange(size + 1, dtype=torch.int32),
            seq_lens_cpu=torch.full((size,), self.max_seq_len, dtype=torch.int32),
        )

    def capture(self, build_metadata: Callable[[BatchMetadata], Any],
                forward: Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor | None]) -> None:
        """Capture every size, largest first, into one memory pool."""
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()
        b = self.buffers
        for size in sorted(self.sizes, reverse=True):
            metadata = build_metadata(self._metadata(size))
            input_ids, positions = b.dev["input_ids"][:size], b.dev["positions"][:size]
            # Warm up outside the capture (kernel compilation, autotuning, library workspaces).
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                forward(input_ids, positions, metadata)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = forward(input_ids, positions, metadata)
            self.graphs[size] = _Graph(graph, logits, metadata)
        torch.cuda.synchronize()
        used = free_before - torch.cuda.mem_get_info()[0]
        logger.info("captured %d CUDA graphs (decode batch sizes %d-%d) in %.1f s, %.0f MiB",
                    len(self.graphs), self.sizes[0], self.sizes[-1], time.perf_counter() - start, used / 2**20)

    def replay(self, size: int) -> torch.Tensor | None:
        """Run the graph of ``size`` on what the buffers hold now; its logits [size, vocab]."""
        entry = self.graphs[size]
        entry.graph.replay()
        return entry.logits
