"""The decoder layer's norm -> projection (-> SiLU) chains: which path a layer takes, decided when it is built, and
fused equals unfused bit for bit.

Built on the CPU the layers run torch code. Built under ``triton_on_cpu`` they run our kernels in Triton's
interpreter: the unfused path is then the separate Triton kernels (``fused.NORM_GEMV`` TORCH when built) and
the fused one the norm + GEMV launch, which must give the same bits, down to the model's logits.
"""

from __future__ import annotations

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.interfaces import LinearMethod, ParallelContext, SingleRankCommunicator
from infer_core.layers import fused
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.fused import norm_gemv
from infer_core.layers.fused.gemv_fusion import MAX_FUSED_K
from infer_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from infer_core.layers.norm import NormedInput, ResidualRMSNorm
from infer_core.layers.unquantized import UnquantizedLinearMethod
from infer_core.testing import LogitsRecorder

HIDDEN, INTER = 48, 40


class PlainLinearMethod(LinearMethod):
    """A dense method that is not the ``none`` quantizer's (as a quantizer plugin's would be): never fused."""

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        layer.register_parameter("weight", torch.nn.Parameter(torch.empty(sum(output_sizes), input_size,
                                                                          dtype=params_dtype), requires_grad=False))
        layer.weight.output_dim, layer.weight.input_dim = 0, 1

    def apply(self, layer, x, bias):
        return torch.nn.functional.linear(x, layer.weight, bias)


def build(*, mlp: bool, dtype=torch.bfloat16, method=None, parallel=None, bias=False, seed=0):
    """(norm, the projection built with it as its input norm, full checkpoint weights): gate_up + SiLU (mlp) or qkv."""
    gen = torch.Generator().manual_seed(seed)
    parallel = parallel or ParallelContext.single()
    norm = ResidualRMSNorm(HIDDEN, 1e-6, dtype=dtype)
    norm.weight.data.copy_(1 + 0.2 * torch.randn(HIDDEN, generator=gen))
    kw = dict(bias=bias, method=method or UnquantizedLinearMethod(), parallel=parallel, dtype=dtype, prefix="p",
              input_norm=norm)
    if mlp:
        linear = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], act=SiluAndMul(), **kw)
        shards = {0: torch.randn(INTER, HIDDEN, generator=gen), 1: torch.randn(INTER, HIDDEN, generator=gen)}
    else:
        linear = QKVParallelLinear(HIDDEN, 8, 4, 2, **kw)
        shards = {s: torch.randn(rows, HIDDEN, generator=gen) for s, rows in (("q", 32), ("k", 16), ("v", 16))}
    for shard_id, tensor in shards.items():
        linear.weight_loader(linear.weight, tensor / HIDDEN**0.5, shard_id)
        if bias:
            linear.weight_loader(linear.bias, torch.randn(tensor.shape[0], generator=gen), shard_id)
    return norm, linear, shards


def chain(norm, linear, x, residual):
    """What the decoder layer runs: ``hidden, residual = norm(x, residual); linear(hidden)``."""
    normed, next_residual = norm(x, residual)
    return linear(normed), next_residual


def rows(num_rows: int, dtype=torch.bfloat16, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_rows, HIDDEN, generator=gen) * 2).to(dtype), torch.randn(num_rows, HIDDEN,
                                                                                      generator=gen).to(dtype)


@pytest.fixture
def fused_launches(monkeypatch):
    """Counts the fused norm + GEMV launches (and runs them)."""
    calls = []
    launch = norm_gemv.rms_norm_gemv
    monkeypatch.setattr(norm_gemv, "rms_norm_gemv", lambda *a, **kw: calls.append(1) or launch(*a, **kw))
    return calls


def test_defaults():
    assert fused.NORM_GEMV is fused.FusedImpl.TRITON
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS

    assert MAX_FUSED_K == MAX_SINGLE_PASS


@pytest.mark.parametrize("mlp", [False, True], ids=["norm-qkv", "norm-gate-up-silu"])
def test_cpu_runs_the_layers_as_before(mlp):
    """Built on the CPU nothing is fused nor deferred: the layers' torch code, as before the fusion existed."""
    norm, linear, _ = build(mlp=mlp)
    assert not norm.triton and not linear.fuses_input_norm and linear.method.after_rms_norm
    assert linear.method.before_silu == mlp
    x, residual = rows(1)
    normed, summed = norm(x, residual)
    assert isinstance(normed, torch.Tensor)
    assert torch.equal(normed, norm.forward_torch(x, residual)[0]) and torch.equal(summed, x + residual)
    out = linear.method.apply(linear, normed, None)
    assert torch.equal(linear(normed), linear.act(out) if mlp else out)
    normed, first_residual = norm(x, None)  # the first layer: the input itself is the residual
    assert first_residual is x and torch.equal(normed, norm.forward_torch(x))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("mlp", [False, True], ids=["norm-qkv", "norm-gate-up-silu"])
def test_fused_equals_the_separate_kernels_at_one_and_two_rows(mlp, bias, triton_on_cpu, monkeypatch,
                                                               fused_launches):
    norm, linear, _ = build(mlp=mlp, bias=bias)
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)  # read when built: the separate kernels
    separate_norm, separate, _ = build(mlp=mlp, bias=bias)
    assert linear.fuses_input_norm and not separate.fuses_input_norm and separate_norm.triton
    for num_rows in (1, 2):
        x, residual = rows(num_rows, seed=num_rows)
        for res in (residual, None):
            fused_launches.clear()
            got, got_residual = chain(norm, linear, x, res)
            assert len(fused_launches) == 1
            want, want_residual = chain(separate_norm, separate, x, res)
            assert len(fused_launches) == 1
            assert torch.equal(got, want) and torch.equal(got_residual, want_residual)
            assert got.shape == (num_rows, INTER if mlp else 64)
            assert (got_residual is x) == (res is None)


def test_fuses_only_where_every_layer_would_run_triton(triton_on_cpu, monkeypatch, fused_launches):
    norm, linear, _ = build(mlp=True)
    assert linear.fuses_input_norm
    x, residual = rows(3)
    got, got_residual = chain(norm, linear, x, residual)  # 3 rows: the norm kernel, F.linear, the SiLU kernel
    assert fused_launches == []
    from infer_core.layers.fused.rms_norm import rms_norm
    from infer_core.layers.fused.silu_and_mul import silu_and_mul

    normed, summed = rms_norm(x, norm.weight, norm.eps, residual)
    assert torch.equal(got_residual, summed)
    assert torch.equal(got, silu_and_mul(torch.nn.functional.linear(normed, linear.weight)))
    assert not build(mlp=True, dtype=torch.float32)[1].fuses_input_norm  # the GEMV runs half precision only
    for op in ("RMS_NORM", "GEMV", "SILU_AND_MUL", "NORM_GEMV"):
        with monkeypatch.context() as patch:
            patch.setattr(fused, op, fused.FusedImpl.TORCH)
            assert not build(mlp=True)[1].fuses_input_norm, op
    assert build(mlp=True)[1].fuses_input_norm


def test_another_linear_method_stays_unfused(triton_on_cpu, fused_launches):
    """A quantizer plugin's method is never fused; it gets the norm's kernel output and its apply runs as before."""
    norm, linear, _ = build(mlp=True, method=PlainLinearMethod())
    assert norm.triton and not linear.fuses_input_norm
    x, residual = rows(1)
    normed, summed = norm(x, residual)
    assert isinstance(normed, NormedInput)
    got = linear(normed)
    assert fused_launches == []
    from infer_core.layers.fused.rms_norm import rms_norm

    want_normed, want_summed = rms_norm(x, norm.weight, norm.eps, residual)
    assert torch.equal(summed, want_summed)  # filled by the norm's kernel when the layer computed it
    assert torch.equal(got, linear.act(linear.method.apply(linear, want_normed, None)))


class ActLinearMethod(PlainLinearMethod):
    """A method with its own gate_up + SiLU-and-mul launch at one row (``apply_with_act``), as the W8A8 GEMV has."""

    def __init__(self) -> None:
        self.calls = []

    def apply_with_act(self, layer, x, bias):
        self.calls.append(x.shape[0])
        if x.shape[0] != 1:
            return None
        gate, up = torch.nn.functional.linear(x.float(), layer.weight.float(), bias).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up).to(x.dtype)  # one rounding: not the layer's two


def test_a_method_may_apply_the_activation_itself():
    """A layer built with an activation asks its method for both in one go first (only then runs apply and the
    activation); a layer without one never asks."""
    method = ActLinearMethod()
    _, linear, _ = build(mlp=True, method=method)
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    one, two = linear(x[:1]), linear(x)
    assert method.calls == [1, 2]
    assert torch.equal(one, method.apply_with_act(linear, x[:1], None))
    assert torch.equal(two, linear.act(torch.nn.functional.linear(x, linear.weight)))
    qkv_method = ActLinearMethod()
    _, qkv, _ = build(mlp=False, method=qkv_method)
    qkv(x)
    assert qkv_method.calls == []


@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_gate_up_shard(rank, triton_on_cpu, monkeypatch):
    """A rank's gate_up is [gate shard; up shard]: fused on its shard equals unfused and the rank's slice."""
    parallel = ParallelContext(rank, 2, SingleRankCommunicator())
    norm, linear, shards = build(mlp=True, parallel=parallel)
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)
    separate_norm, separate, _ = build(mlp=True, parallel=parallel)
    assert linear.weight.shape == (INTER, HIDDEN)  # two halves of INTER // 2 rows
    assert linear.fuses_input_norm and not separate.fuses_input_norm
    x, residual = rows(2)
    got, _ = chain(norm, linear, x, residual)
    assert torch.equal(got, chain(separate_norm, separate, x, residual)[0])
    normed = norm.forward_torch(x, residual)[0].float()
    part = slice(rank * INTER // 2, (rank + 1) * INTER // 2)
    gate, up = (normed @ (shards[i][part] / HIDDEN**0.5).T for i in (0, 1))
    torch.testing.assert_close(got.float(), torch.nn.functional.silu(gate) * up, rtol=0.05, atol=0.05)


def test_refuses_what_it_cannot_fuse():
    norm = ResidualRMSNorm(HIDDEN, 1e-6, dtype=torch.bfloat16)
    kw = dict(bias=False, method=UnquantizedLinearMethod(), parallel=ParallelContext.single(), dtype=torch.bfloat16,
              prefix="p")
    with pytest.raises(ValueError, match="row-parallel"):
        RowParallelLinear(HIDDEN, HIDDEN, input_norm=norm, **kw)
    with pytest.raises(ValueError, match="halves"):
        MergedColumnParallelLinear(HIDDEN, [INTER, INTER + 8], act=SiluAndMul(), **kw)


def run_model(llm: LLM, prompts):
    """(tokens, logits per request) of greedy decoding."""
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], [torch.stack(recorder.logits[o.request_id]) for o in outputs]


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_tiny_model_same_logits_fused_or_not(kind, tiny_checkpoint, triton_on_cpu, monkeypatch, fused_launches):
    """bfloat16 tiny checkpoints built with every norm / dense GEMV / SiLU on the Triton kernels, the chains fused
    (the default) or not (``fused.NORM_GEMV`` TORCH when built).

    Prompts of 1-2 tokens keep every step at <= 2 rows, so every chain of the fused run is one launch (two a layer
    a step); the 5-token prompt's prefill runs the layers one after the other and its decode steps are fused.
    """
    def engine():
        return LLM(str(tiny_checkpoint(kind)), device="cpu", dtype="bfloat16", block_size=16)

    fused_llm = engine()
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)
    separate_llm = engine()
    num_layers = len(fused_llm.engine.executor.worker.runner.model.model.layers)
    for prompts, decode_steps, steps in (([[5, 9]], 3, 3), ([[7], [11]], 3, 3), ([[5, 9, 13, 200, 31]], 2, 3)):
        fused_launches.clear()
        tokens, logits = run_model(separate_llm, prompts)
        assert fused_launches == []
        fused_tokens, fused_logits = run_model(fused_llm, prompts)
        assert len(fused_launches) == 2 * num_layers * decode_steps  # steps - decode_steps prefills unfused
        assert fused_tokens == tokens
        for got, want in zip(fused_logits, logits):
            assert got.shape == want.shape == (steps, 384) and torch.equal(got, want)
