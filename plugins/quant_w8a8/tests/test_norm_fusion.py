"""The decoder layer's norm -> qkv and norm -> gate_up (-> SiLU) chains of a W8A8 model: at decode sizes in one
W8 GEMV launch, at the GEMM's with the activation quantization in the norm's launch.

Built under ``triton_on_cpu`` the layers run our kernels in Triton's interpreter (as on a GPU): the fused paths
are ``gemv.w8_rms_norm_gemv`` and ``norm_quant.rms_norm_quantize`` (``LinearMethod.apply_with_norm``), the
unfused one the core's norm kernel then the W8 GEMV or the GEMM (``fused.NORM_GEMV`` TORCH when built). Both
multiply the same values on the same tiles, so in the interpreter they give the same bits, down to the model's
logits. The launchers are spied on (they still run).
"""

from __future__ import annotations

import pytest
import torch
from infer_core import LLM, SamplingParams
from infer_core.interfaces import ParallelContext
from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.fused import rms_norm
from infer_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
from infer_core.layers.norm import ResidualRMSNorm
from infer_core.testing import LogitsRecorder, make_tiny_checkpoint

from infer_quant_w8a8 import gemv, norm_quant
from infer_quant_w8a8.linear_method import W8A8LinearMethod
from infer_quant_w8a8.schemes import ActivationFormat, LinearScheme, QuantDtype, WeightFormat, online_scheme

HIDDEN, INTER = 64, 40
SCHEMES = {"int8": online_scheme(QuantDtype.INT8), "fp8": online_scheme(QuantDtype.FP8),
           "fp8-groups-of-32": LinearScheme(WeightFormat(QuantDtype.FP8, 32), ActivationFormat(QuantDtype.FP8, 32))}


@pytest.fixture
def launches(monkeypatch):
    """``{"fused": [...], "norm": [...], "norm_quant": [...]}``: calls of the W8 fused launcher, of the core's norm
    kernel and of the norm + activation quantization launch."""
    calls = {"fused": [], "norm": [], "norm_quant": []}
    for key, module, name in (("fused", gemv, "w8_rms_norm_gemv"), ("norm", rms_norm, "rms_norm"),
                              ("norm_quant", norm_quant, "rms_norm_quantize")):
        launch = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _launch=launch, _key=key, **kw: calls[_key].append(1)
                            or _launch(*a, **kw))
    return calls


def build(scheme: LinearScheme, *, mlp: bool, bias: bool = False, seed: int = 0):
    """(norm, the projection built with it as its input norm): gate_up + SiLU (mlp) or qkv, quantized on load."""
    gen = torch.Generator().manual_seed(seed)
    norm = ResidualRMSNorm(HIDDEN, 1e-6, dtype=torch.bfloat16)
    norm.weight.data.copy_(1 + 0.2 * torch.randn(HIDDEN, generator=gen))
    kw = dict(bias=bias, method=W8A8LinearMethod(scheme), parallel=ParallelContext.single(), dtype=torch.bfloat16,
              prefix="p", input_norm=norm)
    if mlp:
        linear = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], act=SiluAndMul(), **kw)
        shards = {0: INTER, 1: INTER}
    else:
        linear = QKVParallelLinear(HIDDEN, 8, 4, 2, **kw)
        shards = {"q": 32, "k": 16, "v": 16}
    for shard_id, rows in shards.items():
        linear.weight_loader(linear.weight, torch.randn(rows, HIDDEN, generator=gen) / HIDDEN**0.5, shard_id)
        if bias:
            linear.weight_loader(linear.bias, torch.randn(rows, generator=gen), shard_id)
    return norm, linear


def rows(num_rows: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(num_rows, HIDDEN, generator=gen) * 2).to(torch.bfloat16),
            torch.randn(num_rows, HIDDEN, generator=gen).to(torch.bfloat16))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("scheme,mlp", [("int8", False), ("int8", True), ("fp8", False)],
                         ids=["int8-norm-qkv", "int8-norm-gate-up-silu", "fp8-norm-qkv"])
def test_the_layer_fuses_its_norm_at_decode_sizes(scheme, mlp, bias, triton_on_cpu, monkeypatch, launches):
    """1, 2 and 8 rows in one launch, equal to the norm kernel then the W8 GEMV; 9 rows (the GEMM's): the norm in
    the activation quantization's launch, equal to the norm kernel then the GEMM."""
    norm, linear = build(SCHEMES[scheme], mlp=mlp, bias=bias)
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)  # read when built: the separate kernels
    separate_norm, separate = build(SCHEMES[scheme], mlp=mlp, bias=bias)
    assert linear.fuses_input_norm and not separate.fuses_input_norm and separate_norm.triton
    for num_rows in (1, 2, 8, 9):
        x, residual = rows(num_rows, seed=num_rows)
        for res in (residual, None):
            for key in launches:
                launches[key].clear()
            normed, got_residual = norm(x, res)
            got = linear(normed)
            assert launches == {"fused": [1] * (num_rows <= 8), "norm": [], "norm_quant": [1] * (num_rows > 8)}
            normed, want_residual = separate_norm(x, res)
            want = separate(normed)
            assert torch.equal(got, want) and torch.equal(got_residual, want_residual)
            assert (got_residual is x) == (res is None)


def test_forward_and_input_stores_the_norm_once(triton_on_cpu, monkeypatch, launches):
    """The MoE router's path: the layer's output and its input, the norm computed in the one launch."""
    norm, linear = build(SCHEMES["int8"], mlp=False)
    for num_rows in (1, 9):
        x, residual = rows(num_rows)
        launches["fused"].clear()
        launches["norm_quant"].clear()
        normed, summed = norm(x, residual)
        out, computed = linear.forward_and_input(normed)
        assert len(launches["fused"]) == (num_rows <= 8) and len(launches["norm_quant"]) == (num_rows > 8)
        want_normed, want_summed = rms_norm.rms_norm(x, norm.weight, norm.eps, residual)
        assert torch.equal(computed, want_normed) and torch.equal(summed, want_summed)
        assert torch.equal(out, linear.method.apply(linear, want_normed, None))


@pytest.mark.parametrize("scheme", ["fp8-groups-of-32", "fp8"])
def test_grouped_weights_and_fp8_gate_up_keep_the_norm_launch(scheme, triton_on_cpu, launches):
    """At decode sizes, weights in groups of K columns and FP8 gate_up are not fused with their norm
    (``W8A8LinearMethod._gemv_takes_norm``): the norm kernel, then the GEMV on its output. At the GEMM's, FP8
    gate_up quantizes in the norm's launch; grouped activations (one scale per token and group) do not."""
    norm, linear = build(SCHEMES[scheme], mlp=True)
    assert norm.triton and linear.method.gemv and not linear.method.norm_in_gemv
    assert linear.fuses_input_norm == linear.method.norm_in_gemm == (scheme == "fp8")
    x, residual = rows(1)
    normed, summed = norm(x, residual)
    got = linear(normed)
    assert launches == {"fused": [], "norm": [1], "norm_quant": []}
    want_normed, want_summed = rms_norm.rms_norm(x, norm.weight, norm.eps, residual)
    assert torch.equal(summed, want_summed)
    assert torch.equal(got, linear.method.apply_with_act(linear, want_normed, None))
    x, residual = rows(9)
    launches["norm"].clear()
    got = linear(norm(x, residual)[0])
    fused_at_gemm = scheme == "fp8"
    assert launches == {"fused": [], "norm": [1] * (not fused_at_gemm), "norm_quant": [1] * fused_at_gemm}
    want_normed, _ = rms_norm.rms_norm(x, norm.weight, norm.eps, residual)
    assert torch.equal(got, linear.act(linear.method.apply(linear, want_normed, None)))


def test_stays_unfused_where_the_layers_would_not_all_run_triton(triton_on_cpu, monkeypatch):
    """The GEMV takes the norm only where the norm, the GEMV and (gate_up) SiLU-and-mul all run our kernels; the
    quantization before the GEMM wherever the norm hands its output on uncomputed (the norm's kernel and the
    core's fusions on: without them the method is not asked)."""
    linear = build(SCHEMES["int8"], mlp=True)[1]
    assert linear.fuses_input_norm and linear.method.norm_in_gemv and linear.method.norm_in_gemm
    for op in ("RMS_NORM", "GEMV", "SILU_AND_MUL", "NORM_GEMV"):
        with monkeypatch.context() as patch:
            patch.setattr(fused, op, fused.FusedImpl.TORCH)
            linear = build(SCHEMES["int8"], mlp=True)[1]
            assert not linear.method.norm_in_gemv, op
            assert linear.fuses_input_norm == (op in ("GEMV", "SILU_AND_MUL")), op
    with monkeypatch.context() as patch:  # a qkv layer has no activation: SiLU's kernel does not matter
        patch.setattr(fused, "SILU_AND_MUL", fused.FusedImpl.TORCH)
        assert build(SCHEMES["int8"], mlp=False)[1].method.norm_in_gemv


def test_the_cpu_runs_the_layers_as_before():
    """Built on the CPU (no interpreter for the layers): nothing is fused, the norm is computed by the norm."""
    norm, linear = build(SCHEMES["int8"], mlp=True)
    assert not norm.triton and not linear.fuses_input_norm and not linear.method.gemv


def run_model(llm: LLM, prompts):
    """(tokens, logits per request) of greedy decoding."""
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], [torch.stack(recorder.logits[o.request_id]) for o in outputs]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("w8a8-norm-fusion"))


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_tiny_qwen3_fuses_every_norm(quantization, qwen3, triton_on_cpu, monkeypatch, launches):
    """A quantized bfloat16 tiny Qwen3 built for our kernels: where the W8 GEMV runs (1 to 8 rows) each decoder
    layer runs its input norm in its qkv launch and (int8) its post-attention norm in its gate_up launch (the norm
    kernel for the final norm and FP8's post-attention norms), with the same logits and tokens as the model built
    with the chains unfused. A 10-token prompt's prefill (the GEMM's rows) quantizes both norms' outputs in the
    norms' launches (the norm kernel for the final norm)."""
    fused_per_layer = 2 if quantization == "int8" else 1
    def engine():
        return LLM(str(qwen3), device="cpu", dtype="bfloat16", block_size=16,
                   quantization=quantization)

    fused_llm = engine()
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)
    separate_llm = engine()
    layers = fused_llm.engine.executor.worker.runner.model.model.layers
    assert all(isinstance(layer.mlp.gate_up_proj.method, W8A8LinearMethod) and layer.self_attn.qkv_proj.fuses_input_norm
               and layer.mlp.gate_up_proj.method.norm_in_gemv == (fused_per_layer == 2)
               and layer.mlp.gate_up_proj.method.norm_in_gemm for layer in layers)
    norms = 2 * len(layers) + 1  # a step's, unfused
    for prompts, fused_steps, steps in (([[5, 9]], 3, 3), ([[7], [11]], 3, 3), ([list(range(20, 30))], 2, 3)):
        for key in launches:
            launches[key].clear()
        tokens, logits = run_model(separate_llm, prompts)
        assert launches == {"fused": [], "norm": [1] * norms * steps, "norm_quant": []}
        launches["norm"].clear()
        fused_tokens, fused_logits = run_model(fused_llm, prompts)
        assert len(launches["fused"]) == fused_per_layer * len(layers) * fused_steps
        assert len(launches["norm_quant"]) == 2 * len(layers) * (steps - fused_steps)
        unfused_per_step = 1 + (2 - fused_per_layer) * len(layers)
        assert len(launches["norm"]) == (steps - fused_steps) + unfused_per_step * fused_steps
        assert fused_tokens == tokens
        for got, want in zip(fused_logits, logits):
            assert got.shape == want.shape == (steps, 384) and torch.equal(got, want)
    fused_llm.shutdown()
    separate_llm.shutdown()
