"""The CPU's own kernels: oneDNN GEMMs on weights packed after the load, bfloat16 within the GPU's bfloat16
tolerance of float32, and the dtype the CPU picks by default."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from infer_core import LLM, SamplingParams
from infer_core.layers import cpu_matmul
from infer_core.testing import LogitsRecorder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 32, 257])
def test_packed_linear_is_f_linear(dtype, rows):
    if not cpu_matmul.packs(torch.empty(1, dtype=dtype)):
        pytest.skip(f"oneDNN does not pack {dtype} on this CPU")
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(96, 80, generator=gen) * 0.1).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(rows, 80, generator=gen).to(dtype)
    packed = cpu_matmul.pack(weight)
    expected = F.linear(x.float(), weight.float(), bias.float())
    for b in (bias, None):
        got = cpu_matmul.packed_linear(x, packed, b)
        assert got.dtype == dtype and got.shape == (rows, 96)
        want = expected if b is not None else expected - bias.float()
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        assert (got.float() - want).norm() / want.norm() < tolerance
    batched = cpu_matmul.packed_linear(x.view(1, rows, 80), packed, bias)  # leading dims kept
    assert batched.shape == (1, rows, 96) and torch.equal(batched[0], cpu_matmul.packed_linear(x, packed, bias))


def test_cpu_engine_packs_every_dense_weight_after_the_load(tiny_checkpoint):
    llm = LLM(str(tiny_checkpoint("qwen3")), device="cpu", dtype="float32")
    model = llm.engine.executor.worker.runner.model
    methods = [m.method for m in model.modules() if hasattr(m, "method")]
    assert methods and all(method.packed is not None for method in methods)
    assert model.lm_head.packed is not None  # tied to the embedding, which keeps the plain weight
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.fixture(scope="module")
def bf16_engine(tiny_checkpoint):
    folder = tiny_checkpoint("llama")
    return folder, LLM(str(folder), device="cpu", dtype="bfloat16", max_num_batched_tokens=64)


def test_cpu_bfloat16_logits_within_the_gpu_tolerance_of_float32(bf16_engine):
    """The GPU's bfloat16 bound (tests/test_gpu.py), on the CPU's bfloat16 path: packed oneDNN GEMMs, the
    torch attention, chunked prefill."""
    from transformers import AutoModelForCausalLM

    folder, llm = bf16_engine
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (7, 90, 300)]
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        with torch.no_grad():
            expected = model(torch.tensor([prompt])).logits[0, -1]
        got = recorder.logits[output.request_id][0].float()
        rel = (got - expected).norm() / expected.norm()
        assert rel < 2e-2, f"{len(prompt)}-token prompt: bfloat16 logits off by {rel:.3e}"
