"""The fused norm + GEMV (+ SiLU-and-mul) launch on CUDA: equal bit for bit to rms_norm + gemv + silu_and_mul at
the real shapes, under CUDA graphs and with PDL, through the decoder layer, and down to a real model's logits."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.layers import fused
from infer_core.layers.fused import gemv_fusion, use_pdl
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
from infer_core.layers.norm import RMSNorm
from infer_core.testing import LogitsRecorder, write_config_checkpoint

pytestmark = pytest.mark.gpu

EPS = 1e-6
# hidden K, qkv rows, gate_up rows (2 x intermediate)
MODELS = {"qwen3-0.6b": (1024, 4096, 6144), "qwen3-8b": (4096, 6144, 24576), "llama-3.1-8b": (4096, 6144, 28672)}


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


def test_decoder_chain_fuses_at_one_and_two_rows():
    from infer_core.builtin.quant_none import UnquantizedLinearMethod
    from infer_core.interfaces import ParallelContext
    from infer_core.layers.activation import SiluAndMul
    from infer_core.layers.linear import MergedColumnParallelLinear

    k, _, n_gate_up = MODELS["qwen3-0.6b"]
    norm = RMSNorm(k, EPS, dtype=torch.bfloat16).cuda()
    linear = MergedColumnParallelLinear(k, [n_gate_up // 2] * 2, bias=False, method=UnquantizedLinearMethod(),
                                        parallel=ParallelContext.single(), dtype=torch.bfloat16, prefix="mlp").cuda()
    x, residual, norm.weight.data, linear.weight.data, _ = inputs(3, n_gate_up, k)
    chain = gemv_fusion.NormLinear(norm, linear, SiluAndMul())
    assert chain.impl is fused.FusedImpl.TRITON and linear.method.after_rms_norm
    assert not chain.fuses(x, residual)  # 3 rows: F.linear
    for num_rows in (1, 2):
        fused_out = chain(x[:num_rows], residual[:num_rows])
        chain.impl = fused.FusedImpl.TORCH
        unfused_out = chain(x[:num_rows], residual[:num_rows])
        chain.impl = fused.FusedImpl.TRITON
        assert chain.fuses(x[:num_rows], residual[:num_rows])
        assert all(torch.equal(a, b) for a, b in zip(fused_out, unfused_out))


def greedy(folder, prompts, **settings):
    """Greedy tokens and every step's logits; calls of the separate qkv_proj layers (eager steps only)."""
    llm = LLM(str(folder), attention="triton", max_num_seqs=16, gpu_memory_utilization=0.4, **settings)
    try:
        calls = []
        for layer in llm.engine.executor.worker.runner.model.model.layers:
            layer.self_attn.qkv_proj.register_forward_hook(lambda *_: calls.append(1))
        with LogitsRecorder(llm.engine) as recorder:
            outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                                   use_tqdm=False)
        logits = [torch.stack(recorder.logits[o.request_id]) for o in outputs]
        return [o.outputs[0].token_ids for o in outputs], logits, len(calls)
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()


def test_qwen3_06b_same_logits_fused_or_not(tmp_path, monkeypatch):
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
        monkeypatch.setattr(gemv_fusion, "NORM_GEMV", impl)  # read when the model is built
        runs[impl] = [greedy(folder, [prompts[0]], **settings), greedy(folder, prompts, **settings)]
    for (tokens, logits, _), (want_tokens, want_logits, _) in zip(runs[fused.FusedImpl.TRITON],
                                                                  runs[fused.FusedImpl.TORCH]):
        assert tokens == want_tokens
        assert all(torch.equal(a, b) for a, b in zip(logits, want_logits))


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_tiny_models_eager_same_logits_and_no_separate_qkv_at_decode(kind, tiny_checkpoint, monkeypatch):
    """Eager bf16 tiny checkpoints: two one-token prompts keep every step at <= 2 rows, so the fused engine
    never calls qkv_proj as a layer; the unfused one does; the logits are equal bit for bit."""
    pytest.importorskip("infer_attention_triton")
    prompts = [[5], [7]]
    settings = dict(dtype="bfloat16", max_model_len=256, enforce_eager=True)
    tokens, logits, calls = greedy(tiny_checkpoint(kind), prompts, **settings)
    monkeypatch.setattr(gemv_fusion, "NORM_GEMV", fused.FusedImpl.TORCH)
    want_tokens, want_logits, want_calls = greedy(tiny_checkpoint(kind), prompts, **settings)
    assert calls == 0 and want_calls > 0
    assert tokens == want_tokens and all(torch.equal(a, b) for a, b in zip(logits, want_logits))
