"""The decoder layer's norm -> projection (-> SiLU) chains: which path runs, and fused equals unfused bit for bit.

On the CPU the layers run torch code; ``force_triton`` on the norm, the dense method and the activation
makes them run our kernels in Triton's interpreter, so the unfused path is the separate Triton kernels
and the fused one (NormLinear.impl TRITON) must give the same bits, down to the model's logits.
"""

from __future__ import annotations

import os

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.builtin.quant_none import UnquantizedLinearMethod
from infer_core.interfaces import LinearMethod, ParallelContext, SingleRankCommunicator
from infer_core.layers.activation import SiluAndMul
from infer_core.layers.fused import FusedImpl
from infer_core.layers.fused.gemv_fusion import MAX_FUSED_K, NORM_GEMV, NormLinear
from infer_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from infer_core.layers.norm import RMSNorm
from infer_core.testing import LogitsRecorder

HIDDEN, INTER = 48, 40
# force_triton runs the kernels on CPU tensors, which only Triton's interpreter can (conftest sets it without CUDA;
# with CUDA, test_norm_gemv_gpu.py runs the same checks on the device)
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton kernels on CPU tensors need TRITON_INTERPRET=1")


class PlainLinearMethod(LinearMethod):
    """A dense method that is not the ``none`` quantizer's (as a quantizer plugin's would be): never fused."""

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        layer.register_parameter("weight", torch.nn.Parameter(torch.empty(sum(output_sizes), input_size,
                                                                          dtype=params_dtype), requires_grad=False))
        layer.weight.output_dim, layer.weight.input_dim = 0, 1

    def apply(self, layer, x, bias):
        return torch.nn.functional.linear(x, layer.weight, bias)


def build(*, mlp: bool, dtype=torch.bfloat16, method=None, parallel=None, bias=False, seed=0):
    """(NormLinear, full checkpoint weights) for a gate_up + SiLU (mlp) or a qkv projection after a norm."""
    gen = torch.Generator().manual_seed(seed)
    parallel = parallel or ParallelContext.single()
    kw = dict(bias=bias, method=method or UnquantizedLinearMethod(), parallel=parallel, dtype=dtype, prefix="p")
    norm = RMSNorm(HIDDEN, 1e-6, dtype=dtype)
    norm.weight.data.copy_(1 + 0.2 * torch.randn(HIDDEN, generator=gen))
    if mlp:
        linear = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], **kw)
        shards = {0: torch.randn(INTER, HIDDEN, generator=gen), 1: torch.randn(INTER, HIDDEN, generator=gen)}
    else:
        linear = QKVParallelLinear(HIDDEN, 8, 4, 2, **kw)
        shards = {s: torch.randn(rows, HIDDEN, generator=gen) for s, rows in (("q", 32), ("k", 16), ("v", 16))}
    for shard_id, tensor in shards.items():
        linear.weight_loader(linear.weight, tensor / HIDDEN**0.5, shard_id)
        if bias:
            linear.weight_loader(linear.bias, torch.randn(tensor.shape[0], generator=gen), shard_id)
    return NormLinear(norm, linear, SiluAndMul() if mlp else None), shards


def force_triton(chain: NormLinear) -> None:
    for layer in (chain.norm, chain.linear.method, chain.act):
        if layer is not None and hasattr(layer, "force_triton"):
            layer.force_triton = True


def rows(num_rows: int, dtype=torch.bfloat16, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_rows, HIDDEN, generator=gen) * 2).to(dtype), torch.randn(num_rows, HIDDEN,
                                                                                      generator=gen).to(dtype)


def run_both(chain: NormLinear, x, residual):
    """(unfused, fused) results of the same chain on the same inputs."""
    chain.impl = FusedImpl.TORCH
    unfused = chain(x, residual)
    chain.impl = FusedImpl.TRITON
    return unfused, chain(x, residual)


def test_defaults():
    assert NORM_GEMV is FusedImpl.TRITON
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS

    assert MAX_FUSED_K == MAX_SINGLE_PASS


@pytest.mark.parametrize("mlp", [False, True], ids=["norm-qkv", "norm-gate-up-silu"])
def test_cpu_runs_the_layers_as_before(mlp):
    """Without force_triton the CPU never fuses: the layers' torch code, as before the fusion existed."""
    chain, _ = build(mlp=mlp)
    x, residual = rows(1)
    assert not chain.fuses(x, residual) and chain.linear.method.after_rms_norm
    normed, summed = chain.norm(x, residual)
    out = chain.linear(normed)
    got, got_residual = chain(x, residual)
    assert torch.equal(got, chain.act(out) if mlp else out) and torch.equal(got_residual, summed)
    got, got_residual = chain(x, None)  # the first layer: the input itself is the residual
    assert got_residual is x and torch.equal(got, (chain.act if mlp else (lambda t: t))(chain.linear(chain.norm(x))))


@needs_interpreter
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("mlp", [False, True], ids=["norm-qkv", "norm-gate-up-silu"])
def test_fused_equals_the_separate_kernels_at_one_and_two_rows(mlp, bias):
    chain, _ = build(mlp=mlp, bias=bias)
    force_triton(chain)
    for num_rows in (1, 2):
        x, residual = rows(num_rows, seed=num_rows)
        assert chain.fuses(x, residual) and chain.fuses(x, None)
        for res in (residual, None):
            (unfused, unfused_res), (fused, fused_res) = run_both(chain, x, res)
            assert torch.equal(fused, unfused) and torch.equal(fused_res, unfused_res)
            assert fused.shape == (num_rows, INTER if mlp else 64)


def test_fuses_only_where_every_layer_would_run_triton():
    chain, _ = build(mlp=True)
    force_triton(chain)
    x, residual = rows(2)
    assert chain.fuses(x, residual)
    assert not chain.fuses(*rows(3))  # 3 rows: F.linear, not the GEMV
    assert not chain.fuses(x.float(), residual.float())  # the GEMV runs half precision only
    for layer in (chain, chain.norm, chain.linear.method, chain.act):
        layer.impl = FusedImpl.TORCH
        assert not chain.fuses(x, residual)
        layer.impl = FusedImpl.TRITON
    chain.act.force_triton = False  # SiLU would run torch code on the CPU: so does the whole chain
    assert not chain.fuses(x, residual)


@needs_interpreter
def test_another_linear_method_stays_unfused():
    """A quantizer plugin's method is never fused, whatever the flags say; its apply runs as before."""
    chain, _ = build(mlp=True, method=PlainLinearMethod())
    force_triton(chain)
    x, residual = rows(1)
    assert not chain.fuses(x, residual) and not hasattr(chain.linear.method, "after_rms_norm")
    normed, summed = chain.norm(x, residual)
    got, got_residual = chain(x, residual)
    assert torch.equal(got, chain.act(chain.linear(normed))) and torch.equal(got_residual, summed)


@needs_interpreter
@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_gate_up_shard(rank):
    """A rank's gate_up is [gate shard; up shard]: fused on its shard equals unfused and the rank's slice."""
    parallel = ParallelContext(rank, 2, SingleRankCommunicator())
    chain, shards = build(mlp=True, parallel=parallel)
    force_triton(chain)
    assert chain.linear.weight.shape == (INTER, HIDDEN)  # two halves of INTER // 2 rows
    x, residual = rows(2)
    (unfused, _), (fused, fused_res) = run_both(chain, x, residual)
    assert torch.equal(fused, unfused)
    normed = chain.norm.forward_torch(x, residual)[0].float()
    part = slice(rank * INTER // 2, (rank + 1) * INTER // 2)
    gate, up = (normed @ (shards[i][part] / HIDDEN**0.5).T for i in (0, 1))
    torch.testing.assert_close(fused.float(), torch.nn.functional.silu(gate) * up, rtol=0.05, atol=0.05)


def test_refuses_what_it_cannot_fuse():
    norm = RMSNorm(HIDDEN, 1e-6, dtype=torch.bfloat16)
    kw = dict(bias=False, method=UnquantizedLinearMethod(), parallel=ParallelContext.single(), dtype=torch.bfloat16,
              prefix="p")
    with pytest.raises(ValueError, match="row-parallel"):
        NormLinear(norm, RowParallelLinear(HIDDEN, HIDDEN, **kw))
    with pytest.raises(ValueError, match="halves"):
        NormLinear(norm, MergedColumnParallelLinear(HIDDEN, [INTER, INTER + 8], **kw), SiluAndMul())


def run_model(llm: LLM, prompts, impl: FusedImpl):
    """(tokens, logits per request, calls of the separate qkv / gate_up layers) with every chain set to impl."""
    layers = llm.engine.executor.worker.runner.model.model.layers
    calls = []
    hooks = [module.register_forward_hook(lambda *_: calls.append(1))
             for layer in layers for module in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj)]
    for layer in layers:
        layer.norm_qkv.impl = layer.norm_gate_up.impl = impl
    try:
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                                   use_tqdm=False)
    finally:
        for hook in hooks:
            hook.remove()
    return ([o.outputs[0].token_ids for o in outputs], [torch.stack(recorder.logits[o.request_id]) for o in outputs],
            len(calls))


@needs_interpreter
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_tiny_model_same_logits_fused_or_not(kind, tiny_checkpoint):
    """bfloat16 tiny checkpoints, every norm / dense GEMV / SiLU forced onto the Triton kernels.

    Prompts of 1-2 tokens keep every step at <= 2 rows, so the fused run calls no separate qkv or gate_up
    layer at all; the 5-token prompt's prefill runs them (F.linear) and its decode steps are fused.
    """
    llm = LLM(str(tiny_checkpoint(kind)), device="cpu", dtype="bfloat16", block_size=16)
    model = llm.engine.executor.worker.runner.model
    for module in model.modules():
        if isinstance(module, (RMSNorm, SiluAndMul)):
            module.force_triton = True
        if isinstance(getattr(module, "method", None), UnquantizedLinearMethod):
            module.method.force_triton = True
    for prompts, all_decode_sized in (([[5, 9]], True), ([[7], [11]], True), ([[5, 9, 13, 200, 31]], False)):
        tokens, logits, calls = run_model(llm, prompts, FusedImpl.TORCH)
        fused_tokens, fused_logits, fused_calls = run_model(llm, prompts, FusedImpl.TRITON)
        assert calls > 0 and (fused_calls == 0 if all_decode_sized else 0 < fused_calls < calls)
        assert fused_tokens == tokens
        for got, want in zip(fused_logits, logits):
            assert got.shape == want.shape == (3, 384) and torch.equal(got, want)
