"""CUDA graphs on a GPU: replaying a captured decode or prefill graph gives the logits of the eager step, and
decode steps replay graphs whose capture is fast (Qwen3-0.6B's shape, dummy weights)."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.runner.cuda_graphs import capture_sizes
from infer_core.testing import LogitsRecorder, write_config_checkpoint


@pytest.fixture(scope="module")
def qwen3_06b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-0.6b")
    return write_config_checkpoint("Qwen3-0.6B", folder)


def _greedy_logits(folder, attention: str, enforce_eager: bool, prompts) -> tuple[list, dict]:
    llm = LLM(str(folder), load_format="dummy", attention=attention, enforce_eager=enforce_eager,
              max_model_len=4096, max_num_seqs=32, gpu_memory_utilization=0.45)
    try:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs], {o.request_id: recorder.logits[o.request_id] for o in outputs}
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["flash", "triton"])
@pytest.mark.parametrize("batch", [8, 5])  # a captured size exactly; one padded to 8
def test_graph_replay_gives_the_eager_logits(qwen3_06b, attention, batch):
    pytest.importorskip({"flash": "flash_attn", "triton": "infer_attention_triton"}[attention])
    rng = random.Random(batch)
    prompts = [[rng.randrange(0, 151936) for _ in range(rng.randrange(20, 700))] for _ in range(batch)]
    eager_tokens, eager_logits = _greedy_logits(qwen3_06b, attention, True, prompts)
    graph_tokens, graph_logits = _greedy_logits(qwen3_06b, attention, False, prompts)
    assert graph_tokens == eager_tokens
    worst = 0.0
    for request_id, steps in eager_logits.items():
        for step, (eager, graph) in enumerate(zip(steps, graph_logits[request_id])):
            rel = float((graph.float() - eager.float()).norm() / eager.float().norm())
            worst = max(worst, rel)
    # The same kernels on the same inputs; only the attention split heuristics may differ (the
    # graph is captured for max_model_len), which moves bfloat16 rounding, not results.
    assert worst < 2e-2, f"graph vs eager logits differ by {worst:.2e} (relative)"


@pytest.mark.gpu
def test_prefill_graph_replay_gives_the_eager_logits(qwen3_06b):
    """One request at a time: a prompt of a captured size exactly (64), one padded (50 -> 64), one past
    the largest graph (600: eager), and the 50-token prompt again (its cached prefix: the chunk after
    it replays a smaller graph with context). Same tokens as eager steps, logits within bf16 rounding."""
    pytest.importorskip("infer_attention_triton")
    rng = random.Random(0)
    base = [rng.randrange(0, 151936) for _ in range(600)]
    prompts = [base[:64], base[100:150], base, base[100:150] + base[:40]]

    def run(enforce_eager: bool):
        llm = LLM(str(qwen3_06b), load_format="dummy", attention="triton", enforce_eager=enforce_eager,
                  max_model_len=4096, max_num_seqs=8, gpu_memory_utilization=0.45)
        replayed: list[int] = []
        try:
            runner = llm.engine.executor.worker.runner
            if runner.graphs is not None:
                replay = runner.graphs.replay_prefill
                runner.graphs.replay_prefill = lambda size: replayed.append(size) or replay(size)
            params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
            tokens, logits = [], []
            with LogitsRecorder(llm.engine) as recorder:
                for prompt in prompts:  # one at a time: each prefill is a one-request step
                    out = llm.generate([prompt], params, use_tqdm=False)[0]
                    tokens.append(out.outputs[0].token_ids)
                    logits.append(recorder.logits[out.request_id])
            return tokens, logits, replayed
        finally:
            llm.shutdown()
            torch.cuda.empty_cache()

    eager_tokens, eager_logits, _ = run(True)
    graph_tokens, graph_logits, replayed = run(False)
    assert replayed == [64, 64, 64], replayed  # 64; 50 padded to 64; 600 eager; the 42 tokens after a cached 48
    assert graph_tokens == eager_tokens
    for eager_steps, graph_steps in zip(eager_logits, graph_logits):
        for eager, graph in zip(eager_steps, graph_steps):
            rel = float((graph.float() - eager.float()).norm() / eager.float().norm())
            assert rel < 2e-2, f"prefill graph vs eager logits differ by {rel:.2e} (relative)"


@pytest.mark.gpu
def test_decode_steps_replay_graphs_and_capture_is_fast(qwen3_06b, caplog):
    caplog.set_level(logging.INFO)
    llm = LLM(str(qwen3_06b), load_format="dummy", max_model_len=4096, gpu_memory_utilization=0.5)
    runner = llm.engine.executor.worker.runner
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("captured"))
    seconds = float(line.split(" in ")[1].split(" s")[0])
    assert seconds < 30, line
    assert sorted(runner.graphs.graphs) == capture_sizes(llm.engine.config.settings.max_num_seqs)
    replays: list[int] = []
    replay = runner.graphs.replay
    runner.graphs.replay = lambda size: replays.append(size) or replay(size)
    prompts = [[i + 1] * 50 for i in range(13)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 20 for o in outputs)
    assert replays and set(replays) == {16}, replays  # 13 decoding requests replay the 16-graph
    assert len(replays) >= 18  # every decode step after the prefill
    llm.shutdown()
