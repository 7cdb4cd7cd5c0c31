"""The engine on a GPU with W8A8 (``-m gpu``): bfloat16, CUDA graphs, the GEMV at decode and the GEMMs at prefill."""

from __future__ import annotations

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.testing import LogitsRecorder, make_tiny_checkpoint

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7] * 3 + list(range(30, 70)), [300, 301, 2, 9]]


def run(folder, **settings):
    llm = LLM(str(folder), device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=256, **settings)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    logits = [torch.stack(recorder.logits[o.request_id]).float().cpu() for o in outputs]
    llm.shutdown()
    return tokens, logits


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # widths of multiples of 16 (torch._scaled_mm), 128 columns (the int8 GEMM's alignment too)
    return make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("w8a8-gpu"), hidden_size=128, intermediate_size=256)


@pytest.mark.parametrize("quantization, limit", [("int8", 0.03), ("fp8", 0.15)])
def test_w8a8_engine_on_cuda(folder, quantization, limit):
    _, base = run(folder)
    tokens, logits = run(folder, quantization=quantization)
    eager_tokens, eager_logits = run(folder, quantization=quantization, enforce_eager=True)
    # the graphs replay what the eager steps compute (cuBLAS may pick other kernels for a graph's padded rows)
    assert tokens == eager_tokens
    for got, eager in zip(logits, eager_logits):
        assert float((got - eager).norm() / eager.norm()) < 1e-2
    for got, expected in zip(logits, base):  # the first sampled position: the prompt's own logits, same context
        assert float((got[0] - expected[0]).norm() / expected[0].norm()) < limit
