"""The fused norm + GEMV (+ SiLU-and-mul) launch on CUDA: equal bit for bit to rms_norm + gemv + silu_and_mul at
the real shapes, under CUDA graphs and with PDL, through the decoder layer, and down to a real model's logits."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.layers import fused
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv import (
    NORM_GEMV_PROGRAMS_PER_SM,
    GemvConfig,
    _large_k_config,
    choose_config,
    config_after_rms_norm,
    gemv,
    num_sms,
)
from infer_core.layers.fused.norm_gemv import gemv_silu_and_mul, rms_norm_gemv
from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.layers.fused.silu_and_mul import silu_and_mul
from infer_core.testing import LogitsRecorder, write_config_checkpoint

pytestmark = pytest.mark.gpu

EPS = 1e-6
# hidden K, qkv rows, gate_up rows (2 x intermediate)
MODELS = {"qwen3-0.6b": (1024, 4096, 6144), "qwen3-1.7b": (2048, 4096, 12288), "qwen3-8b": (4096, 6144, 24576),
          "llama-3.1-8b": (4096, 6144, 28672)}


def inputs(num_rows: int, n: int, k: int, dtype=torch.bfloat16, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(num_rows, k, device="cuda", generator=gen) * 2).to(dtype)
    residual = torch.randn(num_rows, k, device="cuda", generator=gen).to(dtype)
    norm_weight = (1 + 0.2 * torch.randn(k, device="cuda", generator=gen)).to(dtype)
    weight = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    return x, residual, norm_weight, weight, bias


def separate(x, residual, norm_weight, weight, bias, silu, config=None):
    """What the decoder layer launches unfused: rms_norm, gemv (the after-norm tiles), silu_and_mul."""
    normed = rms_norm(x, norm_weight, EPS, residual)
    normed, summed = normed if residual is not None else (normed, None)
    y = gemv(normed, weight, bias, config=config, after_rms_norm=True, before_silu=silu)
    return (silu_and_mul(y) if silu else y), summed


def check_equal(x, residual, norm_weight, weight, bias, silu, config=None):
    got = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu, config=config)
    want, want_sum = separate(x, residual, norm_weight, weight, bias, silu, config)
    if residual is None:
        assert torch.equal(got, want)
    else:
        assert torch.equal(got[0], want) and torch.equal(got[1], want_sum)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_real_shapes_equal_the_separate_kernels(model):
    k, n_qkv, n_gate_up = MODELS[model]
    for n, silu in ((n_qkv, False), (n_gate_up, True)):
        for num_rows in (1, 2):
            x, residual, norm_weight, weight, bias = inputs(num_rows, n, k, seed=num_rows)
            for res in (residual, None):
                for b in (None, bias):
                    check_equal(x, res, norm_weight, weight, b, silu)
            if silu:  # without a norm: the two launches at the plain GEMV's tiles
                assert torch.equal(gemv_silu_and_mul(x, weight, bias), silu_and_mul(gemv(x, weight, bias)))


def several_k_steps(n: int, k: int, silu: bool):
    """config_after_rms_norm's tiles, or where they are one K step (qkv at K=4096) the large-K tiles it gives
    where one step does not hold K: persistent, several steps."""
    sms = num_sms(torch.device("cuda"))
    cfg = config_after_rms_norm(n, k, 2, sms, silu=silu)
    if cfg.block_k >= k:
        cfg = replace(_large_k_config(n, k, cfg.num_warps, sms, silu), programs_per_sm=NORM_GEMV_PROGRAMS_PER_SM)
    return cfg


@pytest.mark.parametrize("model", ["qwen3-8b", "llama-3.1-8b"])
def test_l2_prefetch_changes_no_bit(model):
    """At K=4096 a program takes two K steps and asks L2 for W before the PDL wait: the fused launch gives
    the bits it gives without the prefetch (prefetch_steps=0: the kernel before it), whatever it asks for."""
    if not use_pdl(torch.zeros(1, device="cuda")):
        pytest.skip("the prefetch is issued only with PDL (sm_90 or newer, fused.PDL on)")
    k, n_qkv, n_gate_up = MODELS[model]
    for n, silu in ((n_qkv, False), (n_gate_up, True)):
        cfg = several_k_steps(n, k, silu)
        assert cfg.block_k < k, cfg  # several K steps: a prefetch has something to ask for
        for num_rows in (1, 2):
            x, residual, norm_weight, weight, bias = inputs(num_rows, n, k, seed=num_rows)
            want = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu,
                                 config=replace(cfg, prefetch_steps=0))
            for steps in (1, 2):
                got = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu,
                                    config=replace(cfg, prefetch_steps=steps))
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            if silu:  # without the norm: the plain GEMV's tiles
                plain = choose_config(n, k, 2, num_sms(x.device))
                assert torch.equal(gemv_silu_and_mul(x, weight, bias),
                                   gemv_silu_and_mul(x, weight, bias, config=replace(plain, prefetch_steps=0)))


@pytest.mark.parametrize("model", ["qwen3-8b", "llama-3.1-8b"])
def test_persistent_launch_changes_no_bit(model):
    """At K=4096 (two K steps a block) the fused launch is persistent by default; at 1, 2, 4 programs an SM and
    at one program a block it gives the same bits."""
    k, n_qkv, n_gate_up = MODELS[model]
    for n, silu in ((n_qkv, False), (n_gate_up, True)):
        cfg = several_k_steps(n, k, silu)
        assert cfg.block_k < k and cfg.programs_per_sm > 0, cfg
        for num_rows in (1, 2):
            x, residual, norm_weight, weight, bias = inputs(num_rows, n, k, seed=num_rows)
            want = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu,
                                 config=replace(cfg, programs_per_sm=0))
            for programs_per_sm in (1, 2, 4):
                got = rms_norm_gemv(x, norm_weight, EPS, weight, bias, residual, silu=silu,
                                    config=replace(cfg, programs_per_sm=programs_per_sm))
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), programs_per_sm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n,k", [(1000, 777), (1998, 2500), (6144, 1024)])
def test_every_row_count_unaligned_shapes_and_tiles(n, k, dtype):
    """Up to 8 rows (3 padded to 4), K rows not 16-byte aligned, a several-step tile besides the default."""
    for config in (None, GemvConfig(block_n=8, block_k=256, num_warps=rms_norm_num_warps(k), num_stages=3)):
        for num_rows in (1, 2, 3, 8):
            x, residual, norm_weight, weight, bias = inputs(num_rows, n, k, dtype, seed=num_rows)
            for silu in (False, True):
                check_equal(x, residual, norm_weight, weight, bias, silu, config)


def rms_norm_num_warps(k: int) -> int:
    from infer_core.layers.fused.gemv import rms_norm_warps

    return rms_norm_warps(k)


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "no-pdl"])
def test_graph_replay_equals_eager(pdl, monkeypatch):
    """A decode step's two chains captured back to back (qkv from the input norm, gate_up + SiLU from the
    post-attention norm, the second reading the first's new residual), replayed on new inputs."""
    monkeypatch.setattr(fused, "PDL", pdl)
    k, n_qkv, n_gate_up = MODELS["qwen3-0.6b"]
    x, residual, norm_weight, w_qkv, _ = inputs(2, n_qkv, k, seed=1)
    x2, _, norm_weight2, w_gate_up, _ = inputs(2, n_gate_up, k, seed=2)

    def step():
        qkv, summed = rms_norm_gemv(x, norm_weight, EPS, w_qkv, None, residual)
        act, summed2 = rms_norm_gemv(x2, norm_weight2, EPS, w_gate_up, None, summed, silu=True)
        return qkv, act, summed2

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compiled before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = step()
    torch.cuda.current_stream().wait_stream(stream)
    for seed in range(3):
        new_x, new_residual = inputs(2, 8, k, seed=10 + seed)[:2]
        x.copy_(new_x)
        residual.copy_(new_residual)
        x2.copy_(inputs(2, 8, k, seed=20 + seed)[0])
        graph.replay()
        qkv, summed = separate(x, residual, norm_weight, w_qkv, None, False)
        act, summed2 = separate(x2, summed, norm_weight2, w_gate_up, None, True)
        for got, want in zip(static_out, (qkv, act, summed2)):
            assert torch.equal(got, want)


@pytest.fixture
def launches(monkeypatch):
    """Counts the eager launches of the fused norm + GEMV and of the separate norm kernel (and runs them)."""
    from infer_core.layers.fused import norm_gemv as norm_gemv_module
    from infer_core.layers.fused import rms_norm as rms_norm_module

    counts = {"norm_gemv": 0, "rms_norm": 0}

    def counting(name, launch):
        def run(*args, **kwargs):
            counts[name] += 1
            return launch(*args, **kwargs)
        return run

    monkeypatch.setattr(norm_gemv_module, "rms_norm_gemv", counting("norm_gemv", norm_gemv_module.rms_norm_gemv))
    monkeypatch.setattr(rms_norm_module, "rms_norm", counting("rms_norm", rms_norm_module.rms_norm))
    return counts


def test_decoder_chain_fuses_at_one_and_two_rows(monkeypatch, launches):
    """The post-attention norm and gate_up (+ SiLU) as the decoder layer builds them, on the GPU: one launch at
    1-2 rows, equal bit for bit to the same layers built with the chain unfused (``fused.NORM_GEMV`` TORCH)."""
    from infer_core.interfaces import ParallelContext
    from infer_core.layers.activation import SiluAndMul
    from infer_core.layers.linear import MergedColumnParallelLinear
    from infer_core.layers.norm import ResidualRMSNorm
    from infer_core.layers.unquantized import UnquantizedLinearMethod

    k, _, n_gate_up = MODELS["qwen3-0.6b"]
    x, residual, norm_weight, weight, _ = inputs(3, n_gate_up, k)

    def build():
        with torch.device("cuda"):  # built where it runs: the kernels are chosen then
            norm = ResidualRMSNorm(k, EPS, dtype=torch.bfloat16)
            linear = MergedColumnParallelLinear(k, [n_gate_up // 2] * 2, bias=False, method=UnquantizedLinearMethod(),
                                                parallel=ParallelContext.single(), dtype=torch.bfloat16,
                                                prefix="mlp", input_norm=norm, act=SiluAndMul())
        norm.weight.data, linear.weight.data = norm_weight, weight

        def chain(x, res):  # what the decoder layer runs
            normed, summed = norm(x, res)
            return linear(normed), summed

        return chain, linear

    fused_chain, linear = build()
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)  # read when the layers are built
    separate_chain, separate_linear = build()
    assert linear.fuses_input_norm and linear.method.after_rms_norm and linear.method.before_silu
    assert not separate_linear.fuses_input_norm and separate_linear.method.after_rms_norm
    for num_rows in (1, 2, 3):
        for res in (residual[:num_rows], None):
            launches.update(norm_gemv=0, rms_norm=0)
            fused_out = fused_chain(x[:num_rows], res)
            assert launches == ({"norm_gemv": 1, "rms_norm": 0} if num_rows <= 2 else {"norm_gemv": 0, "rms_norm": 1})
            unfused_out = separate_chain(x[:num_rows], res)
            assert launches["norm_gemv"] == (num_rows <= 2)  # the unfused chain launched none
            assert all(torch.equal(a, b) for a, b in zip(fused_out, unfused_out))


def greedy(folder, prompts, launches, **settings):
    """Greedy tokens, every step's logits, and the launches of the eager steps (``launches``)."""
    llm = LLM(str(folder), attention="triton", max_num_seqs=16, gpu_memory_utilization=0.4, **settings)
    try:
        num_layers = len(llm.engine.executor.worker.runner.model.model.layers)
        launches.update(norm_gemv=0, rms_norm=0)
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                                   use_tqdm=False)
        logits = [torch.stack(recorder.logits[o.request_id]) for o in outputs]
        return [o.outputs[0].token_ids for o in outputs], logits, dict(launches, num_layers=num_layers)
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()


def test_qwen3_06b_same_logits_fused_or_not(tmp_path, monkeypatch, launches):
    """Qwen3-0.6B (dummy bf16, CUDA graphs at decode): fused chains (the default) against the separate kernels.

    One request at a time and two together, so decode steps run at 1 and 2 rows; logits equal bit for bit.
    """
    pytest.importorskip("infer_attention_triton")
    folder = write_config_checkpoint("Qwen3-0.6B", tmp_path / "qwen3-0.6b")
    rng = random.Random(11)
    prompts = [[rng.randrange(0, 151936) for _ in range(rng.randrange(20, 300))] for _ in range(2)]
    settings = dict(load_format="dummy", max_model_len=2048)
    runs = {}
    for impl in (fused.FusedImpl.TRITON, fused.FusedImpl.TORCH):
        monkeypatch.setattr(fused, "NORM_GEMV", impl)  # read when the model is built
        runs[impl] = [greedy(folder, [prompts[0]], launches, **settings),
                      greedy(folder, prompts, launches, **settings)]
    for (tokens, logits, _), (want_tokens, want_logits, _) in zip(runs[fused.FusedImpl.TRITON],
                                                                  runs[fused.FusedImpl.TORCH]):
        assert tokens == want_tokens
        assert all(torch.equal(a, b) for a, b in zip(logits, want_logits))


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_tiny_models_eager_same_logits_and_no_separate_norm_at_decode(kind, tiny_checkpoint, monkeypatch, launches):
    """Eager bf16 tiny checkpoints: two one-token prompts keep every step at <= 2 rows, so the fused engine runs
    each layer's two norms in its GEMV launches (the model's final norm alone is a norm launch, one a step); the
    unfused one runs no fused launch; the logits are equal bit for bit."""
    pytest.importorskip("infer_attention_triton")
    prompts = [[5], [7]]
    settings = dict(dtype="bfloat16", max_model_len=256, enforce_eager=True)
    tokens, logits, counts = greedy(tiny_checkpoint(kind), prompts, launches, **settings)
    monkeypatch.setattr(fused, "NORM_GEMV", fused.FusedImpl.TORCH)
    want_tokens, want_logits, want_counts = greedy(tiny_checkpoint(kind), prompts, launches, **settings)
    assert counts["rms_norm"] > 0 and counts["norm_gemv"] == 2 * counts["num_layers"] * counts["rms_norm"]
    assert want_counts["norm_gemv"] == 0 and want_counts["rms_norm"] == (2 * counts["num_layers"] + 1) * counts[
        "rms_norm"]
    assert tokens == want_tokens and all(torch.equal(a, b) for a, b in zip(logits, want_logits))
