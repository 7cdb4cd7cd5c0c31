"""Expert parallelism on two GPUs (NCCL): EP=2 against one GPU, in float32, both dispatches.

Run on a machine with two GPUs: ``python -m pytest -m gpu plugins/parallel_ep/tests``. Skipped elsewhere.
With the all-to-all dispatch the eager steps (prefills of up to 64 tokens) run on token slices: attention's output
reduce-scattered over NCCL, the grouped-GEMM kernels on what each GPU received, the slices all-gathered; with the
all-reduce dispatch those steps replay piecewise CUDA graphs (the NCCL all-reduces captured in the pieces). Decode
steps, under both, replay CUDA graphs captured on the all-reduce path (the NCCL all-reduces of attention's output and
of the experts' partial sums).
"""

from __future__ import annotations

import random

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.testing import LogitsRecorder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _prompts(vocab: int, lengths=(5, 40, 97, 300, 12)) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def _generate(folder, prompts, **settings):
    llm = LLM(str(folder), device="cuda", dtype="float32", max_model_len=1024, max_num_batched_tokens=64,
              gpu_memory_utilization=0.5, **settings)
    try:
        assert llm.engine.executor.worker.runner.graphs is not None  # decode steps replay CUDA graphs, EP or not
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs], [recorder.logits[o.request_id][0] for o in outputs]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("dispatch", ["all_to_all", "all_reduce"])
@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_two_gpus_match_one_in_float32(tiny_checkpoint, assert_no_workers_left, kind, dispatch):
    folder = tiny_checkpoint(kind)
    prompts = _prompts(384)
    ref_tokens, ref_logits = _generate(folder, prompts)
    tokens, logits = _generate(folder, prompts, expert_parallel_size=2, expert_parallel_dispatch=dispatch)
    assert tokens == ref_tokens
    for got, expected in zip(logits, ref_logits):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    assert_no_workers_left()


def test_piecewise_steps_count_the_load_the_all_to_all_dispatch_counts(tiny_checkpoint, assert_no_workers_left):
    """Under all_reduce the prefill and mixed steps replay piecewise graphs, padded to a captured size, and rank 0
    counts their routing inside the pieces; all_to_all runs the same steps eagerly and counts its exchanged rows:
    the same tokens, layer calls and entries, so no padding row is counted."""
    folder = tiny_checkpoint("qwen3_moe")
    prompts = _prompts(384)
    loads = {}
    for dispatch in ("all_to_all", "all_reduce"):
        llm = LLM(str(folder), device="cuda", dtype="float32", max_model_len=1024, max_num_batched_tokens=64,
                  gpu_memory_utilization=0.5, expert_parallel_size=2, expert_parallel_dispatch=dispatch)
        try:
            assert (llm.engine.executor.worker.runner.piecewise is not None) is (dispatch == "all_reduce")
            llm.generate(prompts, GREEDY, use_tqdm=False)
            loads[dispatch] = llm.engine.executor.parallel.communicator.load.describe()
        finally:
            llm.shutdown()
    eager, pieces = loads["all_to_all"], loads["all_reduce"]
    assert pieces["num_tokens"] == eager["num_tokens"] > 0
    assert pieces["num_dispatches"] == eager["num_dispatches"]
    assert sum(pieces["entries_per_expert"]) == sum(eager["entries_per_expert"])
    assert_no_workers_left()
