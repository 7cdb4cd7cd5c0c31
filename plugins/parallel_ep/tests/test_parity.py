"""EP=2 and EP=4 against one rank on the CPU (gloo, float32): the same greedy tokens, logits equal to rounding.

One engine per case, each running one batch with the same schedule as the reference: a prompt longer than the
token budget (chunked prefill) and two prompts sharing a prefix, the second admitted once the first has cached
it (prefix-cache hits). With the all-to-all dispatch (each rank's slice of the tokens between attentions):
Qwen3-MoE (16 experts, top-4, q/k norms) at EP=2 and EP=4, and Qwen2-MoE (8 experts, a shared expert and a dense
layer, both gathered from the slices; q/k/v biases) at EP=2; steps of 1 to 32 tokens, so slices are uneven and,
at EP=4 in decode, some are all padding. Mixtral (8 experts, top-2, renormalised) at EP=2 with
``expert_parallel_dispatch="all_reduce"``. Each engine start spawns N-1 interpreters, so the cases are few. The
same run checks the load counters (every rank's under all_to_all, rank 0's under all_reduce) and their /metrics
series, and that shutdown leaves nothing
behind; in the Mixtral case a worker is killed after the checks instead, and the engine must report it dead
within seconds (the lifecycle is the core's, shared with tp, whose suite covers the other deaths).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch
import torch.distributed as dist
from infer_core import LLM, SamplingParams
from infer_core.engine.engine_state import EngineSnapshot
from infer_core.interfaces import EngineDeadError
from infer_core.server.metrics import ServerMetrics
from infer_core.testing import LogitsRecorder

from infer_parallel_ep.counted import CountedExperts
from infer_parallel_ep.slices import SlicedFinalNorm, SlicedInputNorm

NUM_NEW_TOKENS = 6
SHARED_PREFIX = 32
SETTINGS = {
    "dtype": "float32",
    "device": "cpu",
    "block_size": 16,
    "max_num_batched_tokens": 32,  # a 40-token prompt is prefilled in two chunks
    "max_num_seqs": 2,
    "num_kv_blocks": 32,
    "enable_prefix_caching": True,
}
CASES = [("qwen3_moe", 2, "all_to_all"), ("qwen3_moe", 4, "all_to_all"), ("qwen2_moe", 2, "all_to_all"),
         ("mixtral", 2, "all_reduce")]
KILLED = "mixtral"  # its case ends with a worker killed between steps
DEADLINE_S = 10.0
_reference: dict[str, tuple] = {}


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(3)
    prefix = [rng.randrange(3, vocab) for _ in range(SHARED_PREFIX)]
    short, long_ = [rng.randrange(3, vocab) for _ in range(5)], [rng.randrange(3, vocab) for _ in range(40)]
    return [prefix + [7, 8], short, long_, prefix + [9]]


def _generate(llm: LLM):
    prompts = _prompts(llm.engine.config.model.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    logits = [torch.stack(recorder.logits[o.request_id]) for o in outputs]
    return [o.outputs[0].token_ids for o in outputs], logits, llm.engine.stats()


def _reference_run(folder, kind: str):
    if kind not in _reference:
        with LLM(str(folder), **SETTINGS) as llm:
            assert llm.engine.config.implementations["parallel"] == "single"
            _reference[kind] = _generate(llm)
    return _reference[kind]


def _check_load(llm: LLM, world: int, dispatch: str) -> None:
    """Every token of every MoE layer routed once, to ``top_k`` experts; the series /metrics serves."""
    model = llm.engine.config.model
    load = llm.engine.executor.parallel.communicator.describe()
    assert load["path"] == f"gloo {dispatch}"
    sparse_layers = sum(model.moe.sparse_layers)
    assert load["num_dispatches"] > 0 and load["num_dispatches"] % sparse_layers == 0
    entries = sum(load["entries_per_expert"])
    assert entries == model.moe.top_k * load["num_tokens"] == sum(load["entries_per_rank"])
    assert len(load["entries_per_expert"]) == model.moe.num_experts and len(load["entries_per_rank"]) == world
    assert load["num_tokens"] <= sum(load["tokens_per_rank"]) <= min(model.moe.top_k, world) * load["num_tokens"]
    assert 1.0 <= load["imbalance"] <= world
    text = ServerMetrics("m", EngineSnapshot, llm.engine.executor.metrics).render().decode()
    first = load["entries_per_expert"][0]
    assert f'infer:moe_expert_entries_total{{expert="0",model_name="m"}} {float(first)}' in text
    assert 'infer:moe_rank_tokens_total{model_name="m",rank="1"}' in text


def _kill_a_worker(llm: LLM) -> None:
    """A worker killed between steps: the next step raises EngineDeadError naming it, within seconds."""
    executor = llm.engine.executor
    pid = executor.worker_pids[0]
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match=rf"expert-parallel worker died \(rank 1 \(pid {pid}\) exited with "
                                              r"code -9 \(SIGKILL\)\)"):
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert time.monotonic() - start < DEADLINE_S
    with pytest.raises(EngineDeadError):
        executor.check_health()  # what the server's /health asks


@pytest.mark.parametrize("kind,world,dispatch", CASES, ids=[f"{k}-ep{w}-{d}" for k, w, d in CASES])
def test_expert_parallel_matches_one_rank(tiny_checkpoint, assert_no_workers_left, kind, world, dispatch):
    folder = tiny_checkpoint(kind)
    ref_tokens, ref_logits, _ = _reference_run(folder, kind)
    llm = LLM(str(folder), expert_parallel_size=world, expert_parallel_dispatch=dispatch, **SETTINGS)
    try:
        assert llm.engine.config.implementations["parallel"] == "ep"
        assert len(llm.engine.executor.worker_pids) == world - 1
        tokens, logits, stats = _generate(llm)
        model = llm.engine.executor.worker.runner.model
        sliced = [m for m in model.modules() if isinstance(m, (SlicedInputNorm, SlicedFinalNorm))]
        if dispatch == "all_to_all":
            assert len(sliced) == llm.engine.config.model.num_layers + 1  # every input norm and the final one
            _check_load(llm, world, dispatch)
        else:  # the core's FusedMoE as built: each rank's experts on every token, partial sums all-reduced
            assert sliced == []
            assert len([m for m in model.modules() if isinstance(m, CountedExperts)]) == sum(
                llm.engine.config.model.moe.sparse_layers)  # rank 0 counts the routing
            _check_load(llm, world, dispatch)
        if kind == KILLED:
            _kill_a_worker(llm)
    finally:
        llm.shutdown()
    assert stats.prefix_hit_tokens >= SHARED_PREFIX  # the prefix-cache path was exercised
    assert tokens == ref_tokens
    for got, expected in zip(logits, ref_logits):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not dist.is_initialized()
    assert_no_workers_left()
