"""The whole engine with ``attention="flash"`` on a Qwen3-0.6B-shaped model with dummy weights.

Teacher-forced logits of a mixed prefill/decode step against the ``torch`` backend, and the
offline-throughput workload (docs/benchmarks.md) run to completion. Needs CUDA and flash_attn.
"""

from __future__ import annotations

import random
import time

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.bench.workload import offline_workload
from infer_core.interfaces import CachedRequestData, NewRequestData, SchedulerOutput
from infer_core.runner.inputs import build_step_inputs
from infer_core.runner.state import apply_scheduler_output
from infer_core.testing import REAL_CONFIGS, write_config_checkpoint

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-0.6b")
    write_config_checkpoint("Qwen3-0.6B", folder)
    return folder


def step_logits(runner, output: SchedulerOutput, positions: dict[str, list[int]]) -> torch.Tensor:
    """Run one step as the runner would and return float32 logits at the chosen query positions.

    ``positions`` maps a request id to indices into its tokens scheduled this step; the tokens
    fed are the ones given (teacher forcing), never sampled.
    """
    apply_scheduler_output(runner.requests, output)
    inputs = build_step_inputs(output, runner.requests, runner.config.block_size, runner.device)
    metadata = runner.attention.build_metadata(inputs.metadata)
    starts = inputs.metadata.query_start_loc_cpu.tolist()
    rows = [starts[inputs.request_ids.index(rid)] + i for rid, idx in positions.items() for i in idx]
    with torch.inference_mode():
        hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, metadata)
        return runner.model.compute_logits(hidden[torch.tensor(rows, device=hidden.device)]).float()


def spread(count: int, length: int) -> list[int]:
    """``count`` indices spread over ``range(length)``, first and last included."""
    return sorted({round(i * (length - 1) / (count - 1)) for i in range(count)})


def mixed_batch_logits(llm: LLM) -> torch.Tensor:
    """Step 1 prefills; step 2 mixes decodes, a prompt's second chunk, a prefix-cache hit and a new prompt."""
    runner = llm.engine.executor.worker.runner
    assert runner.config.block_size == 256
    rng = random.Random(0)

    def tokens(n):
        return [rng.randrange(0, 10000) for _ in range(n)]

    params = SamplingParams(temperature=0)
    a, b, c, f = tokens(600), tokens(900), tokens(40), tokens(200)
    e = a[:512] + tokens(188)  # shares a's first two blocks
    first = SchedulerOutput(
        new_requests=[
            NewRequestData("a", a, 600, params, [0, 1, 2], 0),
            NewRequestData("b", b, 900, params, [3, 4], 0),
            NewRequestData("c", c, 40, params, [5], 0),
        ],
        num_scheduled_tokens={"a": 600, "b": 512, "c": 40},
    )
    step_logits(runner, first, {"a": [599], "b": [511], "c": [39]})
    a_next, c_next = 4242, 777  # the tokens a teacher feeds next
    second = SchedulerOutput(
        new_requests=[
            NewRequestData("e", e, 700, params, [0, 1, 6], 512),
            NewRequestData("f", f, 200, params, [8], 0),
        ],
        cached_requests=[
            CachedRequestData("a", [a_next], [], 600),
            CachedRequestData("b", [], [9, 10], 512),
            CachedRequestData("c", [c_next], [], 40),
        ],
        num_scheduled_tokens={"a": 1, "c": 1, "b": 388, "e": 188, "f": 200},
    )
    # 64 positions: both decodes, and spread over the chunk, the prefix-hit extension and the new prompt.
    positions = {"a": [0], "c": [0], "b": spread(22, 388), "e": spread(20, 188), "f": spread(20, 200)}
    assert sum(map(len, positions.values())) == 64
    return step_logits(runner, second, positions)


def test_teacher_forced_logits_match_torch_backend(qwen3_folder):
    common = {
        "load_format": "dummy",
        "block_size": 256,
        "kv_cache_gb": 1,
        "max_model_len": 4096,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 2048,
    }
    results = {}
    for attention in ("torch", "flash"):
        llm = LLM(str(qwen3_folder), attention=attention, **common)
        assert llm.engine.config.implementations["attention"] == attention
        results[attention] = mixed_batch_logits(llm).cpu()
        llm.shutdown()
        del llm
        torch.cuda.empty_cache()
    expected, got = results["torch"], results["flash"]
    assert got.shape == expected.shape == (64, REAL_CONFIGS["Qwen3-0.6B"]["vocab_size"])
    errors = ((got - expected).norm(dim=-1) / expected.norm(dim=-1)).tolist()
    print(f"relative error per position: max {max(errors):.2e}, mean {sum(errors) / len(errors):.2e}")
    assert max(errors) < 2e-2, [f"{x:.2e}" for x in errors]


def test_flash_gets_256_token_blocks_when_the_block_size_is_unset(qwen3_folder, monkeypatch):
    monkeypatch.setenv("INFER_ATTENTION", "flash")
    monkeypatch.delenv("INFER_BLOCK_SIZE", raising=False)
    llm = LLM(str(qwen3_folder), load_format="dummy", kv_cache_gb=1, max_model_len=4096)
    assert llm.engine.config.implementations["attention"] == "flash"
    assert llm.engine.config.block_size == 256
    out = llm.generate([[1, 2, 3] * 100], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8
    llm.shutdown()


@pytest.mark.slow
def test_offline_throughput_workload_runs(qwen3_folder, capsys):
    workload = offline_workload()
    prompts, lengths = workload.prompts, workload.output_lens
    assert sum(lengths) == 133966
    llm = LLM(str(qwen3_folder), load_format="dummy", attention="flash", max_model_len=4096)
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.6, max_tokens=16, ignore_eos=True), use_tqdm=False)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in lengths]
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == lengths
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    with capsys.disabled():
        print(
            f"\noffline-throughput, attention=flash, {torch.cuda.get_device_name()}: {sum(lengths)} output tokens "
            f"in {elapsed:.1f} s = {sum(lengths) / elapsed:.0f} tok/s "
            f"({'CUDA graphs' if llm.engine.executor.worker.runner.graphs else 'eager'})"
        )
    llm.shutdown()
