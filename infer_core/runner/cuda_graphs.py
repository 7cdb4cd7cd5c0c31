"""CUDA graphs of a step's forward, and the one place that picks graph or eager for a step.

Decode graphs: a decode step's shapes depend only on the batch size, so one graph per size (1, 2,
4, 8, then every 8 up to ``max_num_seqs``) covers every decode step: a batch is padded to the next
captured size with dummy one-token requests that read and write only a spare "pad" KV block. The
graphs read their inputs from the runner's persistent ``StepBuffers`` and share one memory pool
(captured largest first, so the smaller ones fit inside the largest's allocations).

Prefill graphs: a step of one request's prompt chunk (a batch-1 prefill: time to first token) is
otherwise hundreds of launches from Python, which cost the host more than the GPU spends on them.
Prefill graphs hold one request of 16, 32, 64, ... tokens: a chunk is padded with tokens of no
request (they write only the pad block), the attention reads the request's real lengths on the
device, and the graph computes the logits of the one sampled position only. Backends opt in
(``supports_prefill_cuda_graphs``).

Argmax graphs: a greedy decode batch needs only each row's argmax of those logits, so a small graph
per decode size holds that argmax too (``replay_argmax``): no sampler launch from Python.

Verify graphs (speculative decoding, where the runner is told to capture them; they need prefill
graphs): one request verifying k drafts runs its k+1 tokens as a chunk with context, as a prefill
graph does, but samples all of them; a graph of 2, 4, 8 tokens or of the smallest prefill size
computes the logits of its first rows ``logits_indices`` names (as many as the chunk has tokens), so
a batch-1 verify step is one replay. Up to 8 tokens the projections stay on the GEMV (whose rows are
padded to a power of two too) instead of a GEMM over the smallest prefill size's padded rows.

A step meets them in two calls: ``graph_for`` (while its inputs are prepared: the graph its batch
is padded for) and ``forward_step`` (that graph's replay, or the model run eagerly).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from infer_core.interfaces import BatchMetadata, SchedulerOutput
from infer_core.runner.inputs import StepBuffers, StepInputs

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to ``max_num_seqs`` (which is always included)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 8))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def verify_capture_sizes(prefill_sizes: list[int]) -> list[int]:
    """Token counts of the verify graphs: 2, 4, 8 below the smallest prefill graph's, then that one's."""
    return [s for s in (2, 4, 8) if s < prefill_sizes[0]] + prefill_sizes[:1] if prefill_sizes else []


def prefill_capture_sizes(max_tokens: int) -> list[int]:
    """Token counts of the prefill graphs: 16, 32, 64, ... up to ``max_tokens`` (included; 0: none)."""
    sizes = []
    size = 16
    while size < max_tokens:
        sizes.append(size)
        size *= 2
    return sizes + [max_tokens] if max_tokens >= 2 else sizes


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    # what each replay writes: logits [size, vocab] (decode and prefill graphs; None on ranks that do not
    # sample), or token ids [size] (argmax graphs)
    logits: torch.Tensor | None
    metadata: Any  # the backend's metadata for this size: kept alive, since the graph reads its tensors


class CudaGraphRunner:
    """Captures ``forward(input_ids, positions, metadata) -> logits`` per batch size and replays it."""

    def __init__(self, buffers: StepBuffers, block_size: int, max_seq_len: int, sizes: list[int],
                 prefill_sizes: list[int] | None = None, verify: bool = False) -> None:
        self.buffers = buffers
        self.block_size = block_size
        self.max_seq_len = max_seq_len  # the captured metadata serves any context up to this
        self.sizes = sizes
        self.prefill_sizes = [n for n in prefill_sizes or () if n <= buffers.max_num_tokens]
        self.graphs: dict[int, _Graph] = {}
        self.prefill_graphs: dict[int, _Graph] = {}
        self.verify_sizes = verify_capture_sizes(self.prefill_sizes) if verify else []  # their token counts
        if verify and not self.verify_sizes:
            logger.warning("no verify CUDA graph (no prefill graphs here: an attention backend without them, several "
                           "ranks, or prefill_graph_max_tokens=0): every verify step of the speculative policy runs "
                           "eagerly, its launches paid from Python; attention=triton on one rank replays one graph")
        self.verify_graphs: dict[int, _Graph] = {}  # logits of every row of one request's chunk
        self.argmax_graphs: dict[int, _Graph] = {}  # per decode size: each row's argmax of its logits

    def padded_size(self, num_reqs: int) -> int | None:
        """The smallest captured size that holds ``num_reqs`` requests (None: run eagerly)."""
        return _smallest_holding(self.sizes, self.graphs, num_reqs)

    def padded_verify_size(self, num_tokens: int) -> int | None:
        """The verify graph that holds one request's ``num_tokens`` tokens (None: run eagerly)."""
        return _smallest_holding(self.verify_sizes, self.verify_graphs, num_tokens)

    def padded_prefill_size(self, num_tokens: int) -> int | None:
        """The smallest prefill graph that holds one request's ``num_tokens`` tokens (None: run eagerly)."""
        return _smallest_holding(self.prefill_sizes, self.prefill_graphs, num_tokens)

    def _metadata(self, size: int) -> BatchMetadata:
        """Decode-only metadata over the first ``size`` rows of the persistent buffers."""
        b = self.buffers
        b.fill_padding(0, size, 0, size, self.block_size)
        b.host["decode_order"][:size] = np.arange(size)  # each replay's step writes its own order
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
            decode_order=b.dev["decode_order"][:size],
        )

    def prefill_metadata(self, size: int, max_len: int | None = None) -> BatchMetadata:
        """Prompt chunks of ``size`` tokens over the persistent buffers, captured on the pad block: one request,
        or with ``max_len`` as many requests of up to ``max_len`` tokens as hold them (piecewise graphs)."""
        b = self.buffers
        max_len = max_len or size
        lens = [max_len] * (size // max_len) + ([size % max_len] if size % max_len else [])
        num_reqs = len(lens)
        starts = np.cumsum([0, *lens])
        b.host["query_start_loc"][: num_reqs + 1] = starts
        b.host["seq_lens"][:num_reqs] = lens
        b.host["logits_indices"][0] = size - 1
        b.block_tables_np[:num_reqs] = b.pad_block
        b.fill_padding(0, size, num_reqs, num_reqs, self.block_size)
        b.copy_to_device(num_reqs, b.max_blocks_per_req)
        return BatchMetadata(
            num_reqs=num_reqs, num_tokens=size, num_decode_only=0, max_query_len=max(lens),
            max_seq_len=self.max_seq_len, block_size=self.block_size,
            query_start_loc=b.dev["query_start_loc"][: num_reqs + 1],
            seq_lens=b.dev["seq_lens"][:num_reqs],
            block_tables=b.block_tables[:num_reqs],
            slot_mapping=b.dev["slot_mapping"][:size],
            query_start_loc_cpu=torch.from_numpy(starts.astype(np.int32)),
            seq_lens_cpu=torch.full((num_reqs,), self.max_seq_len, dtype=torch.int32),
        )

    def capture(self, build_metadata: Callable[[BatchMetadata], Any],
                forward: Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor | None],
                forward_sampled: Callable[[torch.Tensor, torch.Tensor, Any, torch.Tensor], torch.Tensor | None]
                | None = None, argmax: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Capture every size, largest first, into one memory pool; then the prefill graphs
        (``forward_sampled`` computes the logits of the rows ``logits_indices`` names) and, with
        ``argmax``, each decode size's argmax of its logits."""
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()
        b = self.buffers
        for size in sorted(self.sizes, reverse=True):
            metadata = build_metadata(self._metadata(size))
            self.graphs[size] = _capture(pool, forward, b.dev["input_ids"][:size], b.dev["positions"][:size],
                                         metadata)
        if forward_sampled is not None:
            # clamped: a chunk that does not reach its prompt's end samples nothing and leaves a stale index
            sampled_row = b.dev["logits_indices"][:1]
            for size in sorted(self.prefill_sizes, reverse=True):
                def forward_chunk(ids, pos, md, last=size - 1):
                    return forward_sampled(ids, pos, md, sampled_row.clamp(max=last))

                metadata = build_metadata(self.prefill_metadata(size))
                self.prefill_graphs[size] = _capture(pool, forward_chunk, b.dev["input_ids"][:size],
                                                     b.dev["positions"][:size], metadata)
            for size in sorted(self.verify_sizes, reverse=True):
                # rows past the step's samples hold stale indices: clamped into the chunk, their logits unread
                def forward_verify(ids, pos, md, rows=b.dev["logits_indices"][:size], last=size - 1):
                    return forward_sampled(ids, pos, md, rows.clamp(max=last))

                metadata = build_metadata(self.prefill_metadata(size))
                self.verify_graphs[size] = _capture(pool, forward_verify, b.dev["input_ids"][:size],
                                                    b.dev["positions"][:size], metadata)
        for size, entry in self.graphs.items() if argmax is not None else ():
            if entry.logits is not None:  # a rank that samples
                self.argmax_graphs[size] = _capture(pool, lambda logits, *_: argmax(logits), entry.logits, None, None)
        torch.cuda.synchronize()
        used = free_before - torch.cuda.mem_get_info()[0]
        prefill = (f", one-request prefills of {self.prefill_sizes[0]}-{self.prefill_sizes[-1]} tokens"
                   if self.prefill_graphs else "")
        greedy = " and their greedy argmax" if self.argmax_graphs else ""
        prefill += f", draft verification of up to {self.verify_sizes[-1]} tokens" if self.verify_graphs else ""
        logger.info("captured %d CUDA graphs (decode batch sizes %d-%d%s%s) in %.1f s, %.0f MiB",
                    len(self.graphs) + len(self.prefill_graphs) + len(self.argmax_graphs) + len(self.verify_graphs),
                    self.sizes[0], self.sizes[-1], greedy, prefill,
                    time.perf_counter() - start, used / 2**20)

    def replay(self, size: int) -> torch.Tensor | None:
        """Run the graph of ``size`` on what the buffers hold now; its logits [size, vocab]."""
        entry = self.graphs[size]
        entry.graph.replay()
        return entry.logits

    def replay_argmax(self, size: int) -> torch.Tensor | None:
        """Each row's argmax [size] int64 of the logits the last replay of ``size`` wrote (None: not captured)."""
        entry = self.argmax_graphs.get(size)
        if entry is None:
            return None
        entry.graph.replay()
        return entry.logits

    def replay_verify(self, size: int) -> torch.Tensor | None:
        """Run the verify graph of ``size`` tokens; the logits [size, vocab] of the rows ``logits_indices`` names."""
        entry = self.verify_graphs[size]
        entry.graph.replay()
        return entry.logits

    def replay_prefill(self, size: int) -> torch.Tensor | None:
        """Run the prefill graph of ``size`` tokens; the logits [1, vocab] of the row ``logits_indices[0]``."""
        entry = self.prefill_graphs[size]
        entry.graph.replay()
        return entry.logits


def graph_for(graphs: CudaGraphRunner | None, output: SchedulerOutput) -> tuple[int | None, int | None]:
    """(decode graph's batch size, prefill graph's token count) of the graph that runs the step ``output``
    schedules: at most one is set; (None, None): the step runs eagerly. A decode graph holds steps of
    one-token requests only, a prefill graph one request's chunk; a step that verifies drafts runs in a
    verify graph (its token count, in the second place) when it is one request's, else eagerly."""
    if graphs is None:
        return None, None
    scheduled = output.num_scheduled_tokens
    if output.spec_token_ids:
        return None, graphs.padded_verify_size(next(iter(scheduled.values()))) if len(scheduled) == 1 else None
    if all(n == 1 for n in scheduled.values()):
        return graphs.padded_size(len(scheduled)), None
    if len(scheduled) == 1:  # one request's prompt chunk
        return None, graphs.padded_prefill_size(next(iter(scheduled.values())))
    return None, None


class EagerForward(Protocol):
    def forward_eager(self, inputs: StepInputs) -> torch.Tensor | None:
        """The model run from Python on ``inputs``: the logits of the sampled rows (None: no row samples)."""


def forward_step(inputs: StepInputs, graphs: CudaGraphRunner | None, eager: EagerForward,
                 copy_logits: bool = False) -> torch.Tensor | None:
    """Run the step's forward: the replay of the graph its inputs are padded for (``inputs.decode_graph``
    or ``inputs.prefill_graph``, from ``graph_for``), else ``eager.forward_eager(inputs)`` (the runner
    passes itself: no callable is bound per step). Returns the logits of the sampled rows, one per
    ``inputs.sample_rows`` entry; None when no row samples or this rank does not sample. A graph's
    logits are its output buffer, rewritten by its next replay; ``copy_logits`` (tests, accuracy
    checks) returns a copy of those rows instead."""
    if inputs.decode_graph is not None:
        logits = graphs.replay(inputs.decode_graph)
        if logits is None:  # a rank that does not sample
            return None
        num_reqs = len(inputs.request_ids)
        if len(inputs.sample_rows) == num_reqs:  # every request samples its one row: the output's first rows
            return logits[:num_reqs].clone() if copy_logits else logits[:num_reqs]
        return logits.index_select(0, inputs.logits_indices)  # a one-token chunk short of its prompt's end
    if inputs.prefill_graph is not None:
        if len(inputs.sample_rows) > 1:  # a verify step (a prompt chunk samples one row at most)
            logits = graphs.replay_verify(inputs.prefill_graph)
            return logits[: len(inputs.sample_rows)].clone() if copy_logits else logits[: len(inputs.sample_rows)]
        logits = graphs.replay_prefill(inputs.prefill_graph)  # the KV writes happen whether it samples or not
        if not inputs.sample_rows:
            return None
        return logits.clone() if copy_logits and logits is not None else logits
    return eager.forward_eager(inputs)


def _smallest_holding(sizes: list[int], captured: dict[int, _Graph], n: int) -> int | None:
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) and sizes[i] in captured else None


def _capture(pool, forward: Callable, input_ids: torch.Tensor, positions: torch.Tensor, metadata: Any) -> _Graph:
    """Warm ``forward`` up on a side stream (compiles, library workspaces), then capture it on that stream.

    The same stream: scratch a kernel keeps per stream (the sampler's split counters, zeroed when first
    allocated) then exists, zeroed, before the capture. Allocated inside a capture, its zeroing would be
    a node of that graph only, and another graph replayed first would read whatever the memory held.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward(input_ids, positions, metadata)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        logits = forward(input_ids, positions, metadata)
    return _Graph(graph, logits, metadata)
