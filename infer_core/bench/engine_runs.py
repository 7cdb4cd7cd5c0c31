"""infer's own rows: the offline-throughput workload and batch-1 decode latency, through ``LLM``.

Runs inside a child process of ``infer bench`` (one per attention backend), so each engine has
the device to itself and gives all its memory back when it ends.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from infer_core.bench.compiles import CompileWatch
from infer_core.bench.step_profile import profile_steps
from infer_core.bench.timeline import StepTimeline
from infer_core.bench.workload import (
    WARMUP_MAX_TOKENS,
    WARMUP_PROMPT,
    OfflineWorkload,
    latency_prompt,
)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def start_engine(folder: str, settings: dict[str, Any]):
    """``LLM`` on ``folder`` with ``settings``; returns it with the row fields that describe it."""
    from infer_core import LLM

    started = time.perf_counter()
    llm = LLM(folder, **settings)
    config = llm.engine.config
    return llm, {
        "system": "infer",
        "attention": config.implementations["attention"],
        "parallel": config.implementations["parallel"],
        "block_size": config.block_size,
        "kv_blocks": llm.engine.num_kv_blocks,
        "enforce_eager": bool(config.settings.enforce_eager),
        "startup_s": round(time.perf_counter() - started, 2),
    }


def speculative_figures(llm) -> dict[str, Any]:
    """Acceptance of the decoding policy's drafts over the runs (nothing when it drafts nothing)."""
    stats = llm.engine.decoding.stats()
    if stats is None:
        return {}
    drafts = max(stats.num_drafts, 1)
    return {
        "decoding": llm.engine.config.implementations["decoding"],
        "num_drafts": stats.num_drafts,
        "num_draft_tokens": stats.num_draft_tokens,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
        "acceptance_per_position": [round(n / drafts, 4) for n in stats.accepted_per_position],
    }


def measure_throughput(llm, workload: OfflineWorkload) -> dict[str, Any]:
    """The workload's prompts with a few new tokens each (untimed: Triton compiles a kernel per shape
    specialisation the first time it meets one, which its on-disk cache makes a first-run cost), one
    warm-up request (the nano-vllm benchmark's), then the whole workload by ``LLM.generate``:
    output tokens / wall time."""
    from infer_core import SamplingParams

    def warmup() -> SamplingParams:
        return SamplingParams(temperature=workload.temperature, max_tokens=WARMUP_MAX_TOKENS, ignore_eos=True)

    # Same lengths, other tokens: the warm-up must leave none of the timed prompts in the prefix cache.
    # One SamplingParams per request, as in the timed run: a batch sharing one object samples
    # through another kernel variant (one temperature for all rows), which would leave the timed
    # run's variants to compile mid-run.
    vocab = llm.engine.config.model.vocab_size
    llm.generate([[(t + 1) % vocab for t in p] for p in workload.prompts], [warmup() for _ in workload.prompts],
                 use_tqdm=False)
    llm.generate([WARMUP_PROMPT], warmup(), use_tqdm=False)
    warm = cached_prompt_tokens(llm.engine.scheduler.kv_allocator, workload.prompts)
    if warm:
        raise RuntimeError(f"the warm-up left {warm} of the timed prompts' {workload.num_prompt_tokens} tokens in the "
                           f"prefix cache: its prompts must share no block with the timed ones")
    before = llm.engine.stats()
    params = [SamplingParams(temperature=workload.temperature, ignore_eos=True, max_tokens=n)
              for n in workload.output_lens]
    timeline, compiles = StepTimeline(), CompileWatch()
    timeline.attach(llm.engine.scheduler)
    compiles.start()
    _sync()
    start = time.perf_counter()
    try:
        outputs = llm.generate(workload.prompts, params, use_tqdm=False)
        _sync()
    finally:
        timeline.detach(llm.engine.scheduler)
    end = time.perf_counter()
    elapsed = end - start
    after = llm.engine.stats()
    produced = [len(o.outputs[0].token_ids) for o in outputs]
    if produced != workload.output_lens:
        raise RuntimeError(f"the engine produced {sum(produced)} tokens, the workload asks for "
                           f"{workload.num_output_tokens}: ignore_eos or max_tokens was not honoured")
    return {
        "output_tok_s": round(sum(produced) / elapsed, 1),
        "output_tokens": sum(produced),
        "prompt_tokens": workload.num_prompt_tokens,
        "elapsed_s": round(elapsed, 3),
        "num_prompts": len(workload.prompts),
        "step_timeline": timeline.summary(end),
        "slowest_steps": timeline.slowest(end),
        "compiled_during_run": compiles.compiled(),
        # hits within the run: the prompts' own shared starts, and preempted requests finding their blocks again
        "prefix_hit_tokens": after.prefix_hit_tokens - before.prefix_hit_tokens,
        "num_preemptions": after.num_preemptions - before.num_preemptions,
    }


def cached_prompt_tokens(allocator, prompts: list[list[int]]) -> int:
    """Tokens of ``prompts`` the prefix cache would serve now, as the scheduler looks them up (all but the last
    token); lookups only: no block is taken and no statistic counted.

    This is what the warm-up must leave at zero. The timed run's own hit counter cannot say it: a request
    preempted for KV blocks (a small cache) finds its freed blocks again when it resumes, and a workload's
    prompts may share their starts (a chat template)."""
    probe = "infer-bench-cache-probe"
    total = 0
    for prompt in prompts:
        total += allocator.lookup_prefix(probe, prompt, len(prompt) - 1).num_tokens
        allocator.free(probe)  # the lookup's memoised block keys
    return total


def profile_throughput(llm, workload: OfflineWorkload, skip_steps: int, num_steps: int,
                       trace_path: Path | None) -> dict[str, Any]:
    """The workload again: ``skip_steps`` steps (the prefills), then ``num_steps`` profiled; the rest aborted."""
    from infer_core import SamplingParams

    engine = llm.engine
    ids = [engine.add_request(f"profile-{i}", prompt,
                              SamplingParams(temperature=workload.temperature, ignore_eos=True, max_tokens=n))
           for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens))]
    try:
        for _ in range(skip_steps):
            if not engine.has_unfinished_requests():
                break
            engine.step()
        if not engine.has_unfinished_requests():
            raise ValueError(f"the workload finished within --profile-skip {skip_steps} steps; lower it")
        return profile_steps(engine.step, num_steps, trace_path)
    finally:
        for request_id in ids:
            engine.abort(request_id)


def time_one_request(engine, new_tokens: int) -> tuple[float, float, float]:
    """Step ``engine`` until its one request ends: (start, first token on the host, end), perf_counter
    seconds. With overlapped steps the prefill's token comes back one ``step()`` later, so the first
    token is taken from the outputs, not from the first step."""
    _sync()
    start = time.perf_counter()
    first = None
    num_tokens = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            num_tokens += len(output.outputs[0].delta_token_ids)
            if first is None and num_tokens:
                first = time.perf_counter()
    _sync()
    end = time.perf_counter()
    if num_tokens != new_tokens:
        raise RuntimeError(f"expected {new_tokens} tokens at batch 1, got {num_tokens}")
    return start, first, end


def measure_latency(llm, prompt_len: int, new_tokens: int, repeats: int, warmups: int = 1) -> dict[str, Any]:
    """Batch 1 through the step loop: time to first token, then decode ms per token, mean and p50."""
    from infer_core import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    prompt = latency_prompt(prompt_len, engine.config.model.vocab_size)
    e2e, ttft = [], []
    for run in range(warmups + repeats):
        engine.add_request(f"latency-{run}", prompt, params)
        start, first, end = time_one_request(engine, new_tokens)
        if run >= warmups:
            e2e.append(end - start)
            ttft.append(first - start)
    return latency_figures(e2e, ttft, new_tokens)


def latency_figures(e2e: list[float], ttft: list[float], new_tokens: int) -> dict[str, Any]:
    """The same figure names for every system: output tok/s end to end, decode ms/token, TTFT."""
    decode_ms = [(total - first) / (new_tokens - 1) * 1e3 for total, first in zip(e2e, ttft)]
    tok_s = [new_tokens / total for total in e2e]
    return {
        "output_tok_s": round(statistics.mean(tok_s), 1),
        "output_tok_s_p50": round(statistics.median(tok_s), 1),
        "ms_per_token": round(statistics.mean(decode_ms), 4),
        "ms_per_token_p50": round(statistics.median(decode_ms), 4),
        "decode_tok_s": round(1e3 / statistics.mean(decode_ms), 1),
        "ttft_ms": round(statistics.mean(ttft) * 1e3, 3),
        "repeats": len(e2e),
        "ms_per_token_runs": [round(ms, 4) for ms in decode_ms],
    }


def profile_latency(llm, prompt_len: int, skip_steps: int, num_steps: int, trace_path: Path | None) -> dict[str, Any]:
    """Batch-1 decode steps under the profiler, after the prefill and ``skip_steps`` decode steps."""
    from infer_core import SamplingParams

    engine = llm.engine
    prompt = latency_prompt(prompt_len, engine.config.model.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=skip_steps + num_steps + 2, ignore_eos=True)
    engine.add_request("latency-profile", prompt, params)
    try:
        for _ in range(1 + skip_steps):
            engine.step()
        return profile_steps(engine.step, num_steps, trace_path)
    finally:
        engine.abort("latency-profile")
