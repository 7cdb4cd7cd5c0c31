"""Piecewise CUDA graphs on a GPU (Qwen3-0.6B's shape, dummy weights): steps of several prompts, prompt chunks
beside decodes and prefix hits replay the pieces and give the tokens, and within bfloat16 rounding the logits,
of the same steps run from Python; the views the pieces keep do not hold the pool's memory."""

from __future__ import annotations

import random

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.runner.piecewise_graphs import unowned_view
from infer_core.testing import LogitsRecorder, write_config_checkpoint


@pytest.fixture(scope="module")
def qwen3_06b(tmp_path_factory):
    return write_config_checkpoint("Qwen3-0.6B", tmp_path_factory.mktemp("qwen3-0.6b"))


def _run(folder, attention: str, piecewise: bool, prompts) -> tuple[list, dict, list[int]]:
    llm = LLM(str(folder), load_format="dummy", attention=attention, piecewise_cuda_graphs=piecewise,
              max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=1024, gpu_memory_utilization=0.45)
    replayed: list[int] = []
    try:
        runner = llm.engine.executor.worker.runner
        assert (runner.piecewise is not None) == piecewise
        if piecewise:
            replay = runner.piecewise.replay
            runner.piecewise.replay = lambda size, md: replayed.append(size) or replay(size, md)
        params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        logits = {o.request_id: recorder.logits[o.request_id] for o in outputs}
        return [o.outputs[0].token_ids for o in outputs], logits, replayed
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["flash", "triton"])
def test_piecewise_steps_give_the_eager_tokens_and_logits(qwen3_06b, attention):
    """12 prompts of 30-900 tokens with a 1,024-token step budget: multi-prompt prefills, chunks beside
    decodes; the last two share long prefixes with earlier prompts (prefix-cache hits, chunks with context)."""
    pytest.importorskip({"flash": "flash_attn", "triton": "infer_attention_triton"}[attention])
    rng = random.Random(7)
    prompts = [[rng.randrange(0, 151936) for _ in range(rng.randrange(30, 900))] for _ in range(12)]
    prompts += [prompts[3][:512] + prompts[5][:100], prompts[7] + prompts[1][:60]]
    eager_tokens, eager_logits, _ = _run(qwen3_06b, attention, False, prompts)
    tokens, logits, replayed = _run(qwen3_06b, attention, True, prompts)
    assert replayed and max(replayed) == 1024 and min(replayed) < 1024, replayed
    assert tokens == eager_tokens
    worst = 0.0
    for request_id, steps in eager_logits.items():
        for eager, piece in zip(steps, logits[request_id]):
            worst = max(worst, float((piece.float() - eager.float()).norm() / eager.float().norm()))
    # the same kernels; GEMMs over padded rows may pick other tiles, which moves bfloat16 rounding only
    assert worst < 2e-2, f"piecewise vs eager logits differ by {worst:.2e} (relative)"


@pytest.mark.gpu
def test_an_unowned_view_reads_the_memory_but_does_not_keep_it():
    base = torch.arange(30, dtype=torch.bfloat16, device="cuda").reshape(3, 10)[:, 2:7]
    view = unowned_view(base)
    assert torch.equal(view, base) and view.data_ptr() == base.data_ptr() and view.stride() == base.stride()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    big = torch.empty(1 << 22, dtype=torch.float32, device="cuda")
    kept = unowned_view(big)
    del big
    assert torch.cuda.memory_allocated() == before and kept.numel() == 1 << 22
