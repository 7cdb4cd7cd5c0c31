"""The engine on a GPU with W8A8 (``-m gpu``): bfloat16, CUDA graphs, the GEMV at decode and the GEMMs at prefill."""

from __future__ import annotations

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.testing import LogitsRecorder, make_tiny_checkpoint

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7] * 3 + list(range(30, 70)), [300, 301, 2, 9]]


def run(folder, device="cuda", dtype="bfloat16", max_tokens=16, **settings):
    extra = {"gpu_memory_utilization": 0.3} if device == "cuda" else {}
    llm = LLM(str(folder), device=device, dtype=dtype, max_model_len=256, **extra, **settings)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    logits = [torch.stack(recorder.logits[o.request_id]).float().cpu() for o in outputs]
    llm.shutdown()
    return tokens, logits


def distance(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # widths of multiples of 16 (torch._scaled_mm), 128 columns (the int8 GEMM's alignment too)
    return make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("w8a8-gpu"), hidden_size=128, intermediate_size=256)


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_w8a8_engine_on_cuda(folder, quantization):
    """CUDA graphs replay the eager steps; and the prompt's logits move from the unquantized model's by what the
    CPU reference W8A8 moves them on the same model.

    That distance is the model's, not a constant: on this checkpoint (random weights, hidden 128) the CPU
    reference moves the three prompts' logits by 2.8-5.7% (int8) and 10-19% (fp8) in bfloat16 and float32, and
    the quantized model is so sensitive that bfloat16's rounding alone moves its logits by 3-4% (int8) and
    8-11% (fp8) from float32's (one activation flipping to the next 8-bit value flips others downstream).
    So: the GPU's distance at most the CPU reference's in bfloat16 plus that spread, both measured here.
    """
    _, base = run(folder)
    tokens, logits = run(folder, quantization=quantization)
    eager_tokens, eager_logits = run(folder, quantization=quantization, enforce_eager=True)
    # the graphs replay what the eager steps compute (cuBLAS may pick other kernels for a graph's padded rows)
    assert tokens == eager_tokens
    for got, eager in zip(logits, eager_logits):
        assert distance(got, eager) < 1e-2
    cpu = {(dtype, q): run(folder, "cpu", dtype, max_tokens=1, **({"quantization": q} if q else {}))[1]
           for dtype in ("bfloat16", "float32") for q in (None, quantization)}
    for i, (got, expected) in enumerate(zip(logits, base)):  # the first sampled position: the prompt's own logits
        reference = distance(cpu["bfloat16", quantization][i][0], cpu["bfloat16", None][i][0])
        spread = distance(cpu["bfloat16", quantization][i][0], cpu["float32", quantization][i][0])
        assert distance(got[0], expected[0]) <= reference + spread, (i, reference, spread)


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_w8a8_decode_runs_the_norms_in_the_gemv(folder, quantization, monkeypatch):
    """Every decoder layer's qkv and gate_up run their input norm in their W8 GEMV launch at decode (the layers'
    flags), in CUDA graphs as eagerly; and the tokens and logits are those of the model built with the norms
    unfused (``fused.NORM_GEMV`` TORCH): the same norm values, the GEMV's float32 sums in another order at most."""
    from infer_core.layers import fused
    from infer_quant_w8a8 import gemv

    calls = []
    launch = gemv.w8_rms_norm_gemv
    monkeypatch.setattr(gemv, "w8_rms_norm_gemv", lambda *a, **kw: calls.append(1) or launch(*a, **kw))
    llm = LLM(str(folder), device="cuda", dtype="bfloat16", max_model_len=256, gpu_memory_utilization=0.3,
              quantization=quantization, enforce_eager=True)
    layers = llm.engine.executor.worker.runner.model.model.layers
    assert all(layer.self_attn.qkv_proj.fuses_input_norm and layer.mlp.gate_up_proj.fuses_input_norm
               for layer in layers)
    llm.shutdown()
    calls.clear()
    tokens, logits = run(folder, quantization=quantization)
    assert calls  # captured into the graphs (and run by the warm-up)
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)
    unfused_tokens, unfused_logits = run(folder, quantization=quantization)
    assert tokens == unfused_tokens
    for got, want in zip(logits, unfused_logits):
        assert distance(got, want) < 1e-2
