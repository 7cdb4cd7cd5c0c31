"""Tiny mixture-of-experts models whose routers and experts run our kernels (as on a GPU), in the interpreter,
against the same models on the torch path; every other layer runs its torch code in both (the other kernels
have tests of their own, and the interpreter is slow)."""

from __future__ import annotations

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.layers import fused
from infer_core.layers.fused import moe_gemm
from infer_core.testing import TINY_MOE_ARCHITECTURES, LogitsRecorder

PROMPTS = [[5, 9], [7, 200, 31, 4, 4, 100, 17, 3, 250]]  # decode-sized and prefill-sized steps


def run_model(llm: LLM):
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], [torch.stack(recorder.logits[o.request_id]) for o in outputs]


@pytest.mark.parametrize("kind", TINY_MOE_ARCHITECTURES)
def test_experts_on_the_kernels_match_the_torch_path(kind, tiny_checkpoint, triton_on_cpu, monkeypatch):
    for op in ("RMS_NORM", "ROTARY", "SILU_AND_MUL", "QK_NORM_ROPE", "GEMV", "NORM_GEMV"):
        monkeypatch.setattr(fused, op, fused.FusedImpl.TORCH)
    launches = []
    launch = moe_gemm.fused_experts
    monkeypatch.setattr(moe_gemm, "fused_experts", lambda *a, **kw: launches.append(1) or launch(*a, **kw))

    def engine():
        return LLM(str(tiny_checkpoint(kind)), device="cpu", dtype="float32", block_size=16)

    kernels = engine()
    monkeypatch.setattr(fused, "MOE", fused.FusedImpl.TORCH)  # read when the experts' method is built
    torch_path = engine()
    tokens, logits = run_model(torch_path)
    assert launches == []
    kernel_tokens, kernel_logits = run_model(kernels)
    sparse_layers = sum(kernels.engine.config.model.moe.sparse_layers)
    assert len(launches) == 2 * sparse_layers  # a prefill and a decode step
    assert kernel_tokens == tokens
    for got, want in zip(kernel_logits, logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
