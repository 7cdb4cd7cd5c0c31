"""The dummy steps a rank runs before it serves: the memory profile that sizes its KV cache, and the
warm-up that compiles kernels.

Both run made-up requests through ``ModelRunner.execute``, the same path a real step takes, and leave
nothing behind: the runner's request table is cleared after each, and the profiling step's KV cache is
freed before the real one is allocated.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from infer_core.interfaces import NewRequestData, SchedulerOutput
from infer_core.layers.attention import attention_layers
from infer_core.layers.sampler import SamplingBatch, fused_kernels, sample
from infer_core.runner.graph_plan import piecewise_graph_sizes
from infer_core.runner.kv_cache import allocate_kv_caches, cpu_num_blocks, cuda_num_blocks
from infer_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from infer_core.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)

def dummy_output(per_req: list[int], params: SamplingParams, block_size: int) -> tuple[SchedulerOutput, int]:
    """A step of new requests with ``per_req`` prompt tokens each, on blocks 0, 1, ...; and the
    number of blocks it uses."""
    output = SchedulerOutput()
    next_block = 0
    for i, n in enumerate(per_req):
        num_blocks = -(-n // block_size)
        ids = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        rid = f"dummy-{i}"
        output.new_requests.append(NewRequestData(rid, [0] * n, n, params, ids, 0))
        output.num_scheduled_tokens[rid] = n
    return output, next_block


def profile_num_blocks(runner: ModelRunner) -> int:
    """KV blocks that fit on the runner's rank (after a max-size dummy step on CUDA)."""
    config, s = runner.config, runner.config.settings
    max_useful = s.max_num_seqs * -(-config.max_model_len // config.block_size)
    if runner.device.type != "cuda":
        return cpu_num_blocks(s.kv_cache_gb, runner.bytes_per_block(), max_useful)
    logger.info("profiling the largest step (%d tokens) to size the KV cache…", s.max_num_batched_tokens)
    start = time.perf_counter()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(runner.device)
    profile_step(runner)
    torch.cuda.synchronize(runner.device)
    transient = torch.cuda.max_memory_allocated(runner.device) - torch.cuda.memory_allocated(runner.device)
    # A captured decode batch of max_num_seqs tokens needs about that share of the profiled
    # activations (which are for max_num_batched_tokens tokens); the piecewise graphs' pool keeps a
    # forward's activations at the largest step.
    graph_tokens = max([s.max_num_seqs, *runner.prefill_graph_sizes()])
    graph_share = min(1.0, graph_tokens / s.max_num_batched_tokens) if runner.uses_cuda_graphs() else 0.0
    if piecewise_graph_sizes(runner) and transient > 0:
        graph_share += forward_activations(runner) / transient
    torch.cuda.empty_cache()
    logger.info("profiled in %.1f s", time.perf_counter() - start)
    return cuda_num_blocks(s.gpu_memory_utilization, s.kv_cache_gb, runner.bytes_per_block(), runner.device,
                           max_useful, graph_share, transient)


def profile_step(runner: ModelRunner) -> None:
    """One forward + sampling at the largest step the scheduler may produce, on a KV cache of just
    the blocks it uses (freed after).

    The batch holds the longest prefill chunk that fits next to ``max_num_seqs - 1`` one-token
    requests, and every row samples with top-k, top-p, penalties and 20 logprobs: the peak of
    both the forward pass and the sampler.
    """
    config, s = runner.config, runner.config.settings
    num_reqs = max(1, min(s.max_num_seqs, s.max_num_batched_tokens))
    longest = max(1, min(s.max_num_batched_tokens - (num_reqs - 1), config.max_model_len - 1))
    per_req = [longest] + [1] * (num_reqs - 1)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1, logprobs=20)
    output, num_blocks = dummy_output(per_req, params, config.block_size)
    runner.kv_caches = allocate_kv_caches(config.model.num_layers, num_blocks, config.block_size,
                                          runner.num_kv_heads, config.model.head_dim, runner.kv_dtype, runner.device)
    runner.execute(output)
    runner.requests.clear()
    runner.kv_caches = []


def forward_activations(runner: ModelRunner) -> int:
    """Bytes a forward alone (no row sampled) allocates at the largest step: a prompt chunk short of its end."""
    config, s = runner.config, runner.config.settings
    num_tokens = max(1, min(s.max_num_batched_tokens, config.max_model_len - 1))
    num_blocks = -(-(num_tokens + 1) // config.block_size)
    output = SchedulerOutput()
    output.new_requests.append(NewRequestData("dummy-forward", [0] * (num_tokens + 1), num_tokens + 1,
                                              SamplingParams(), list(range(num_blocks)), 0))
    output.num_scheduled_tokens["dummy-forward"] = num_tokens
    runner.kv_caches = allocate_kv_caches(config.model.num_layers, num_blocks, config.block_size,
                                          runner.num_kv_heads, config.model.head_dim, runner.kv_dtype, runner.device)
    torch.cuda.synchronize(runner.device)
    before = torch.cuda.memory_allocated(runner.device)
    torch.cuda.reset_peak_memory_stats(runner.device)
    runner.execute(output)
    torch.cuda.synchronize(runner.device)
    peak = torch.cuda.max_memory_allocated(runner.device) - before
    runner.requests.clear()
    runner.kv_caches = []
    return peak


def warm_up(runner: ModelRunner) -> None:
    """Compile the kernels' other shape variants now rather than in the first requests' steps.

    Triton specialises integer arguments on divisibility by 16 (and on 1), and the profiling
    step and the graph capture use only such sizes; a mixed step of odd sizes and small
    sampled batches (top-k/top-p at 3 rows, plain temperature at 1) covers the rest, and the
    attention backend compiles the choices its steps make from their lengths (``warm_up``).
    """
    logger.info("warming up kernels for odd step sizes and the sampler's batch sizes…")
    start = time.perf_counter()
    for per_req, params in (([19, 1, 1], SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05)),
                            ([5], SamplingParams(temperature=0.6))):
        output, _ = dummy_output(per_req, params, runner.config.block_size)
        runner.execute(output)  # writes only into blocks no request holds yet
        runner.requests.clear()
    warm_up_sampler(runner.config.settings.max_num_seqs, runner.config.model.vocab_size, runner.dtype, runner.device)
    runner.attention.warm_up(attention_layers(runner.model), runner.kv_caches, runner.buffers.block_tables,
                             runner.dtype)
    if runner.draft is not None:  # a speculative policy's draft model: its own backend, heads and cache
        runner.draft.attention.warm_up(attention_layers(runner.draft.model), runner.draft.kv_caches,
                                       runner.buffers.block_tables, runner.dtype)
    settings = runner.config.settings
    # the kernel runs only in a step planned over a verify step: overlap on, and drafts without a draft model (whose
    # policy reads each verify step before drafting, so its steps run serially)
    if settings.decoding != "standard" and settings.async_scheduling is not False and runner.draft is None:
        from infer_core.layers.sampling import kept_drafts

        kept_drafts.warm_up(runner.device, runner.buffers.block_tables.stride(0), runner.config.block_size)
    torch.cuda.synchronize(runner.device)
    logger.info("warmed up kernels for odd step sizes and the sampler's batch sizes in %.1f s",
                time.perf_counter() - start)


def warm_up_sampler(max_num_seqs: int, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """Compile the sampler's kernels for every launch plan a batch of 1..max_num_seqs rows meets:
    greedy, one temperature for all rows (requests sharing a SamplingParams) and a temperature
    per row (each request its own, as the server and ``LLM.generate`` with a list make them).
    Otherwise the first steps at each new batch size compile them, mid-run."""
    kernels = fused_kernels()
    if kernels is None:
        return
    generator = torch.Generator(device=device).manual_seed(0)  # the runner's stream stays as it was
    for num_rows in kernels.row_counts_per_plan(max_num_seqs, vocab_size, device):
        logits = torch.randn(num_rows, vocab_size, device=device).to(dtype)
        per_row = torch.full((num_rows,), 0.7, dtype=torch.float32, device=device)
        for batch in (SamplingBatch(temperature=None, all_greedy=True),
                      SamplingBatch(temperature=0.7, all_greedy=False, generator=generator),
                      SamplingBatch(temperature=per_row, all_greedy=False, generator=generator)):
            sample(logits, batch)
