"""Which CUDA graphs a rank captures, and capturing them: decode, prefill, verify and argmax graphs
(cuda_graphs.py), then the piecewise graphs for every other step (piecewise_graphs.py).

Whole-step graphs need the attention backend's and the parallel strategy's support; one-request prefill graphs
are for one rank only, piecewise graphs for one rank or a strategy that says its collectives capture between two
attentions (``ParallelStrategy.supports_piecewise_cuda_graphs``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from infer_core.layers.sampler import greedy_argmax
from infer_core.runner.cuda_graphs import (
    CudaGraphRunner,
    capture_sizes,
    prefill_capture_sizes,
)
from infer_core.runner.piecewise_graphs import PiecewiseGraphs, piecewise_sizes

if TYPE_CHECKING:
    from infer_core.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def uses_cuda_graphs(runner: ModelRunner) -> bool:
    """Whether the rank captures CUDA graphs at all (``ModelRunner.uses_cuda_graphs`` asks once and keeps it)."""
    if runner.device.type != "cuda" or runner.config.settings.enforce_eager:
        return False
    names = runner.config.implementations
    if not runner.attention.capabilities(runner.ctx).supports_cuda_graphs:
        logger.info("CUDA graphs off: attention %r does not support them; every step runs eagerly", names.get("attention"))
        return False
    if not runner.strategy.supports_cuda_graphs:
        logger.info("CUDA graphs off: parallel strategy %r does not support them; every step runs eagerly",
                    names.get("parallel"))
        return False
    return True


def prefill_graph_sizes(runner: ModelRunner) -> list[int]:
    """Token counts of the one-request prefill graphs: none where the backend does not support them,
    and with several ranks."""
    if (not runner.uses_cuda_graphs() or runner.parallel.world_size > 1
            or not runner.attention.capabilities(runner.ctx).supports_prefill_cuda_graphs):
        return []
    return prefill_capture_sizes(runner.config.settings.prefill_graph_max_tokens)


def piecewise_graph_sizes(runner: ModelRunner) -> list[int]:
    """Token counts of the piecewise graphs (``piecewise_cuda_graphs``): up to the largest step the scheduler
    can make (``max_num_batched_tokens``, and no more than ``max_num_seqs`` requests at ``max_model_len``), on one
    rank or where the parallel strategy supports them."""
    settings = runner.config.settings
    if not settings.piecewise_cuda_graphs or not runner.uses_cuda_graphs():
        return []
    if runner.parallel.world_size > 1 and not runner.strategy.supports_piecewise_cuda_graphs:
        return []
    largest = max(settings.max_num_batched_tokens, settings.max_num_seqs)
    return piecewise_sizes(min(largest, settings.max_num_seqs * runner.config.max_model_len))


def capture_graphs(runner: ModelRunner) -> tuple[CudaGraphRunner | None, PiecewiseGraphs | None]:
    """Capture the rank's graphs over its step buffers and KV cache (allocated before)."""
    if not runner.uses_cuda_graphs():
        return None, None
    settings = runner.config.settings
    # a decoding policy other than the standard one may verify drafts: a batch-1 verify step has its graph
    verify = runner.config.implementations.get("decoding", "standard") != "standard"
    graphs = CudaGraphRunner(runner.buffers, runner.config.block_size, runner.config.max_model_len,
                             capture_sizes(settings.max_num_seqs), prefill_graph_sizes(runner), verify)
    logger.info("capturing CUDA graphs…")
    with torch.inference_mode():
        graphs.capture(runner.attention.build_metadata, runner._forward_logits, runner._forward_sampled,
                       greedy_argmax)
        sizes = piecewise_graph_sizes(runner)
        if not sizes:
            return graphs, None
        piecewise = PiecewiseGraphs(sizes)
        dev = runner.buffers.dev
        piecewise.capture(runner.model, dev["input_ids"], dev["positions"], runner.kv_caches,
                          lambda size: runner.attention.build_metadata(
                              graphs.prefill_metadata(size, runner.config.max_model_len)), runner.dtype)
    return graphs, piecewise
