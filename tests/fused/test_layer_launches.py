"""The kernels a model step launches, in order, where the model is built for our kernels (as on a GPU).

The tiny models run on the CPU in Triton's interpreter (``triton_on_cpu``); the launchers are spied on, so
the order and the arguments that choose a kernel's tiles are those a GPU would get. Per decoder layer at
decode sizes (1-2 rows): norm + qkv GEMV in one launch, q/k norm + rotary (+ the KV write, Qwen3), attention,
o_proj GEMV, norm + gate_up GEMV + SiLU-and-mul in one launch, down_proj GEMV. At prefill sizes: the norm
kernel (with the residual add), F.linear, the same attention, F.linear, the norm kernel, F.linear, the SiLU
kernel, F.linear.
"""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from infer_core import LLM, SamplingParams
from infer_core.layers.fused import gemv, norm_gemv, qk_norm_rope, rms_norm, rotary, silu_and_mul


@pytest.fixture
def launches(monkeypatch):
    """Every launcher call as ``(name, what chooses its kernel or tiles)``, while ``recording[0]`` is true."""
    log, recording = [], [False]

    def spy(module, name, describe):
        launch = getattr(module, name)

        def run(*args, **kwargs):
            if recording[0]:
                log.append(describe(*args, **kwargs))
            return launch(*args, **kwargs)

        monkeypatch.setattr(module, name, run)

    spy(rms_norm, "rms_norm", lambda x, w, eps, residual=None, **kw: ("rms_norm", residual is not None))
    spy(norm_gemv, "rms_norm_gemv", lambda x, nw, eps, w, b=None, residual=None, **kw: (
        "norm_gemv", kw.get("silu", False), residual is not None, kw.get("residual_out") is not None))
    spy(gemv, "gemv", lambda x, w, b=None, **kw: ("gemv", kw.get("after_rms_norm", False),
                                                  kw.get("before_silu", False)))
    spy(silu_and_mul, "silu_and_mul", lambda x: ("silu_and_mul",))
    spy(qk_norm_rope, "qk_norm_rope_inplace", lambda *a, **kw: ("qk_norm_rope", kw.get("kv_cache") is not None))
    spy(rotary, "rotary_inplace", lambda *a, **kw: ("rotary",))
    spy(F, "linear", lambda x, w, b=None: ("linear", x.shape[0]))
    return log, recording


def run_steps(llm: LLM, prompts, launches) -> list[list[tuple]]:
    """The launches of each model forward (and of each step's logits), one list a forward."""
    log, recording = launches
    runner = llm.engine.executor.worker.runner
    model, backend, steps = runner.model, runner.attention, []
    forward, logits, attend = model.forward, model.compute_logits, backend.forward

    def recorded(fn, label):
        def run(*args, **kwargs):
            log.clear()
            recording[0] = True
            try:
                return fn(*args, **kwargs)
            finally:
                recording[0] = False
                steps.append([label, *log])
        return run

    def attention(layer, q, k, v, kv_cache, metadata, **kw):
        log.append(("attention", kw.get("kv_written", False)))
        return attend(layer, q, k, v, kv_cache, metadata, **kw)

    model.forward, model.compute_logits, backend.forward = recorded(forward, "model"), recorded(logits, "logits"), \
        attention
    try:
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    finally:
        model.forward, model.compute_logits, backend.forward = forward, logits, attend
    return steps


def expected_layer(kind: str, num_rows: int, first: bool) -> list[tuple]:
    qk = [("qk_norm_rope", True), ("attention", True)] if kind == "qwen3" else [("rotary",), ("attention", False)]
    if num_rows <= 2:
        return [("norm_gemv", False, not first, not first), *qk, ("gemv", False, False),
                ("norm_gemv", True, True, True), ("gemv", False, False)]
    return [("rms_norm", not first), ("linear", num_rows), *qk, ("linear", num_rows), ("rms_norm", True),
            ("linear", num_rows), ("silu_and_mul",), ("linear", num_rows)]


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_decode_and_prefill_launch_the_kernels_in_order(kind, tiny_checkpoint, triton_on_cpu, launches):
    llm = LLM(str(tiny_checkpoint(kind)), device="cpu", dtype="bfloat16", block_size=16)
    num_layers = len(llm.engine.executor.worker.runner.model.model.layers)
    for prompts, rows in (([[5, 9, 13, 200, 31]], [5, 1]), ([[7], [11]], [2, 2])):
        steps = run_steps(llm, prompts, launches)
        expected = []
        for num_rows in rows:
            model = [step for i in range(num_layers) for step in expected_layer(kind, num_rows, first=i == 0)]
            final_norm = ("rms_norm", True)
            expected += [["model", *model, final_norm], ["logits", ("gemv", False, False)]]
        assert steps == expected
