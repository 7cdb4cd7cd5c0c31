"""Overlapped scheduling under tensor parallelism (CPU, gloo, float32).

Every rank samples from the all-gathered logits and reads a pending token from its own sampled
ids, so the ranks must draw the same tokens: a rank that drew another one would feed another
token's embedding slice into the all-reduce, and the logits would leave TP=1's at once. Each case
runs the same requests at TP=1 and TP=2 and compares tokens, finish reasons, logprobs and the
logits of every sampled position: greedy, seeded sampling with top-k/top-p/min-p and every
penalty, unseeded sampling (the runner's generator, seeded alike on every rank), logprobs, n=2,
and stops, with overlap on and off, in chunked prefill next to decodes and under preemption.
A worker killed while steps overlap ends the engine in seconds; on shutdown and after such a death
rank 0's runner is freed before the group is left (on CUDA its graphs hold the NCCL communicator,
which NCCL will not destroy or abort while they live).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref

import pytest
import torch
import torch.distributed as dist
from infer_core import LLM, SamplingParams
from infer_core.errors import EngineDeadError
from infer_core.testing import LogitsRecorder

DEADLINE_S = 10.0
SETTINGS = {"device": "cpu", "dtype": "float32", "block_size": 16, "max_num_seqs": 4}


def _prompt(length: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % 380 + 3 for i in range(length)]


MIXED = [
    (_prompt(17), SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)),
    (_prompt(5, 11), SamplingParams(seed=7, temperature=0.9, top_k=20, top_p=0.9, max_tokens=12, ignore_eos=True)),
    (_prompt(40, 5), SamplingParams(seed=3, temperature=1.0, presence_penalty=1.5, frequency_penalty=0.7,
                                    repetition_penalty=1.3, max_tokens=13, ignore_eos=True)),
    (_prompt(9, 2), SamplingParams(temperature=0, repetition_penalty=2.0, max_tokens=10, ignore_eos=True)),
    (_prompt(23, 8), SamplingParams(seed=11, temperature=0.7, min_p=0.05, max_tokens=1, ignore_eos=True)),
    (_prompt(31, 4), SamplingParams(seed=5, temperature=0.8, n=2, max_tokens=8, logprobs=3, ignore_eos=True)),
    (_prompt(12, 6), SamplingParams(temperature=1.0, frequency_penalty=0.5, max_tokens=11, ignore_eos=True)),
    (_prompt(26, 9), SamplingParams(temperature=0.8, top_k=30, max_tokens=9, logprobs=2, ignore_eos=True)),
]
UNSEEDED = {6, 7}  # the rows that draw from the runner's generator


def _run(folder, tensor_parallel_size: int, overlap: bool, rows=range(len(MIXED)), **settings):
    llm = LLM(str(folder), tensor_parallel_size=tensor_parallel_size, async_scheduling=overlap,
              **{**SETTINGS, "num_kv_blocks": 64, **settings})
    try:
        assert llm.engine.overlap is overlap
        prompts, params = [MIXED[i][0] for i in rows], [MIXED[i][1] for i in rows]
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        completions = [[(c.token_ids, c.finish_reason, c.logprobs) for c in o.outputs] for o in outputs]
        logits = {rid: torch.stack(rows) for rid, rows in recorder.logits.items()}  # n=2: per child request
        return completions, logits, llm.engine.stats()
    finally:
        llm.shutdown()


def _assert_same(got, expected) -> None:
    assert len(got) == len(expected)
    for request_got, request_expected in zip(got, expected, strict=True):
        for (ids_a, reason_a, lp_a), (ids_b, reason_b, lp_b) in zip(request_got, request_expected, strict=True):
            assert (ids_a, reason_a) == (ids_b, reason_b)
            assert (lp_a is None) == (lp_b is None)
            for step_a, step_b in zip(lp_a or [], lp_b or [], strict=True):
                assert step_a.keys() == step_b.keys()
                for token in step_a:
                    assert step_a[token].logprob == pytest.approx(step_b[token].logprob, abs=1e-4)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "lockstep"])
@pytest.mark.parametrize("settings", [
    {},
    {"max_num_batched_tokens": 24, "num_kv_blocks": 6},  # chunked prefill next to decodes; preemption
], ids=["plain", "chunked-preempting"])
def test_two_ranks_sample_the_tokens_of_one(tiny_checkpoint, assert_no_workers_left, overlap, settings):
    folder = tiny_checkpoint("qwen3")
    expected, ref_logits, _ = _run(folder, 1, overlap, **settings)
    got, logits, stats = _run(folder, 2, overlap, **settings)
    _assert_same(got, expected)
    assert logits.keys() == ref_logits.keys()
    for rid, rows in logits.items():
        torch.testing.assert_close(rows, ref_logits[rid], rtol=1e-4, atol=1e-4)
    assert [len(c[0]) for r in got for c in r] == [14, 12, 13, 10, 1, 8, 8, 11, 9]
    if settings:
        assert stats.num_preemptions > 0  # the recompute path was exercised
    assert_no_workers_left()


def test_overlapped_two_ranks_give_the_tokens_of_one_rank_in_lockstep(tiny_checkpoint, assert_no_workers_left):
    """Greedy and seeded requests do not depend on how steps were launched, nor on the rank count."""
    folder = tiny_checkpoint("llama")  # untied embeddings: the LM head is its own vocabulary-parallel matrix
    deterministic = [i for i in range(len(MIXED)) if i not in UNSEEDED]
    expected, _, _ = _run(folder, 1, False, deterministic)
    got, _, _ = _run(folder, 2, True, deterministic)
    _assert_same(got, expected)


def _watch_runner_release(llm: LLM) -> list[bool]:
    """Whether the group still existed when rank 0's runner was freed (one entry once it is).

    A runner's CUDA graphs hold the NCCL communicator: it must be gone before the group is left.
    """
    freed_while_in_group: list[bool] = []
    runner = llm.engine.executor.worker.runner
    llm._runner_ref = weakref.ref(runner, lambda _: freed_while_in_group.append(dist.is_initialized()))
    return freed_while_in_group


def test_shutdown_frees_the_runner_before_leaving_the_group(tiny_checkpoint, assert_no_workers_left):
    llm = LLM(str(tiny_checkpoint("qwen3")), tensor_parallel_size=2, **{**SETTINGS, "num_kv_blocks": 64})
    freed_while_in_group = _watch_runner_release(llm)
    llm.generate([_prompt(9)], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    llm.shutdown()
    assert freed_while_in_group == [True]
    assert not dist.is_initialized()
    assert_no_workers_left()


def test_worker_killed_while_steps_overlap(tiny_checkpoint, assert_no_workers_left):
    # overlap asked for: on the CPU it is off unless asked (a CPU step runs as it is launched)
    llm = LLM(str(tiny_checkpoint("qwen3")), tensor_parallel_size=2,
              **{**SETTINGS, "num_kv_blocks": 256, "async_scheduling": True})
    assert llm.engine.overlap
    freed_while_in_group = _watch_runner_release(llm)
    (pid,) = llm.engine.executor.worker_pids
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    prompts = [_prompt(3 + i, i) for i in range(4)]
    long = SamplingParams(seed=1, temperature=0.8, repetition_penalty=1.2, max_tokens=1000, ignore_eos=True)
    timer = threading.Timer(1.0, kill)
    timer.start()
    try:
        with pytest.raises(EngineDeadError, match=rf"rank 1 \(pid {pid}\)"):
            llm.generate(prompts, long, use_tqdm=False)
    finally:
        timer.cancel()
    assert killed_at and time.monotonic() - killed_at[0] < DEADLINE_S
    assert freed_while_in_group == [True]  # even with the failed step's traceback still held by pytest
    with pytest.raises(EngineDeadError):
        llm.engine.executor.check_health()
    llm.shutdown()
    assert_no_workers_left()
