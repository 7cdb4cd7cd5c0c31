"""The fused sampling kernel on CUDA at real shapes, and the distributions it draws from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from infer_core.layers.sampler import SamplingBatch, sample
from infer_core.layers.sampling.philox import philox_uint32, seed_key

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
kernel_parts = pytest.importorskip("infer_core.layers.sampling.kernel_parts")

pytestmark = pytest.mark.gpu

def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _load("fused_checks")
kernel_checks = _load("kernel_checks")

VOCAB = 151936  # Qwen3's


@pytest.mark.parametrize("num_rows", [1, 3, 64, 256])
def test_fused_matches_reference_at_real_shapes(num_rows):
    checks.check_matches_reference("cuda", num_rows, VOCAB)


@pytest.mark.parametrize("num_rows", [1, 8, 64])
def test_grammar_masked_rows_match_the_reference_at_real_shapes(num_rows):
    checks.check_masked_rows("cuda", num_rows, VOCAB)


def test_ties_across_slices_on_cuda():
    checks.check_ties_across_slices("cuda", VOCAB)


def test_seeded_rows_ignore_the_batch_on_cuda():
    checks.check_seeded_rows_ignore_the_batch("cuda", VOCAB)


@triton.jit(do_not_specialize=["key", "position"])
def _noise_bits_kernel(out_ptr, key: tl.int64, position: tl.int64, NC: tl.constexpr, NATIVE: tl.constexpr):
    bits = kernel_parts.noise_bits(key, position, tl.arange(0, NC), NATIVE)
    tl.store(out_ptr + tl.arange(0, NC)[:, None] * 4 + tl.arange(0, 4)[None, :], bits.to(tl.int64))


@pytest.mark.parametrize("native", [True, False], ids=["mul.wide", "randint4x"])
def test_noise_bits_match_the_torch_philox(native):
    """The kernel's Philox (inline PTX on the GPU) draws what philox.py draws, token for token."""
    for seed in (0, 1, -7, 2**63 + 5):
        for position in (0, 3, 2**32 - 1):
            out = torch.empty(4096, dtype=torch.int64, device="cuda")
            _noise_bits_kernel[(1,)](out, seed_key(seed), position, NC=1024, NATIVE=native)
            expected = philox_uint32(torch.tensor([seed_key(seed)]), torch.tensor([position]), 4096)[0]
            assert torch.equal(out.cpu(), expected), (seed, position)


@pytest.mark.parametrize("num_rows", [1, 7, 256])
def test_argmax_matches_torch_at_real_shapes(num_rows):
    kernel_checks.check_argmax_matches_torch("cuda", num_rows, VOCAB)


@pytest.mark.parametrize("num_rows", [1, 5, 64])
def test_split_plans_agree_at_real_shapes(num_rows):
    kernel_checks.check_split_plans_agree("cuda", num_rows, VOCAB)


def test_bounds_keep_the_winner_on_cuda():
    """The fast log2 of the GPU (not the interpreter's exact one) inside the bound: still exact tokens."""
    kernel_checks.check_bounds_keep_the_winner("cuda", VOCAB)


def test_cut_bounds_keep_the_winner_on_cuda():
    """Under cuts, at real shapes: slices with one kept token whose bound overflows, or none kept."""
    kernel_checks.check_cut_bounds_keep_the_winner("cuda", VOCAB)


def test_unseeded_rows_follow_the_generator_on_cuda():
    kernel_checks.check_unseeded_rows_follow_the_generator("cuda", VOCAB)


def test_uniform_temperature_on_cuda():
    kernel_checks.check_uniform_temperature("cuda", VOCAB)


@pytest.mark.parametrize("num_rows", [1, 256, 1500])
def test_place_tokens_on_cuda(num_rows):
    kernel_checks.check_place_tokens("cuda", num_rows)


def test_place_sampled_tokens_is_one_launch():
    from torch.profiler import ProfilerActivity, profile

    from infer_core.layers.sampler import place_sampled_tokens

    input_ids = torch.zeros(8, dtype=torch.int32, device="cuda")
    dst, src = torch.tensor([3], dtype=torch.int32, device="cuda"), torch.tensor([0], dtype=torch.int32, device="cuda")
    sampled = torch.tensor([151000], device="cuda")
    place_sampled_tokens(input_ids, dst, sampled, src)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        place_sampled_tokens(input_ids, dst, sampled, src)
        torch.cuda.synchronize()
    assert len([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]) == 1
    assert input_ids.tolist() == [0, 0, 0, 151000, 0, 0, 0, 0]


def test_sampling_is_one_launch():
    """A temperature batch and a greedy batch each launch one kernel on the device (no torch ops, no copies)."""
    from torch.profiler import ProfilerActivity, profile

    for num_rows in (1, 256):
        logits = (torch.randn(num_rows, VOCAB, device="cuda") * 3).bfloat16()
        for batch in (SamplingBatch(temperature=torch.full((num_rows,), 0.6, device="cuda"), all_greedy=False,
                                    generator=torch.Generator(device="cuda").manual_seed(0)),
                      SamplingBatch(temperature=None, all_greedy=True)):
            sample(logits, batch)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                sample(logits, batch)
                torch.cuda.synchronize()
            kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            expected = "argmax_kernel" if batch.all_greedy else "sample_kernel"
            assert len(kernels) == 1 and expected in kernels[0], (num_rows, batch.all_greedy, kernels)


# ---------------------------------------------------------------------------------------------
# bf16 logits (the model's) read as they are: the same tokens, no float32 copy, no host sync


@pytest.mark.parametrize("num_rows", [1, 3, 64, 256])
def test_low_precision_matches_float_at_real_shapes(num_rows):
    checks.check_low_precision_matches_float("cuda", num_rows, VOCAB)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_greedy_ties_pick_the_lowest_index_on_cuda(dtype):
    generator = torch.Generator().manual_seed(2)
    logits = torch.randint(-3, 4, (256, VOCAB), generator=generator).float()  # each row's maximum ~20,000 times
    logits[::3] = torch.randn(len(logits[::3]), VOCAB, generator=generator) * 8  # ties made by rounding
    logits[1, :] = 2.0
    logits[4, -1] = 100.0
    logits = logits.to(dtype)
    expected = np.argmax(logits.float().numpy(), axis=1)  # numpy: the first maximal value
    batch = SamplingBatch(temperature=torch.zeros(256, device="cuda"), all_greedy=True)
    tokens = sample(logits.cuda(), batch).token_ids.cpu().numpy()
    assert (tokens == expected).all(), np.nonzero(tokens != expected)
    assert (sample(logits.cuda().float(), batch).token_ids.cpu().numpy() == expected).all()


def _bf16_batches(num_rows):
    """The offline-throughput case (temperature) and its neighbours, as built on the device."""
    generator = torch.Generator().manual_seed(num_rows)
    column = lambda v, dtype=torch.float32: torch.full((num_rows,), v, dtype=dtype, device="cuda")  # noqa: E731
    seeded = dict(seeds=torch.randint(0, 2**62, (num_rows,), generator=generator).cuda(),
                  positions=torch.arange(num_rows, device="cuda"),
                  is_seeded=torch.arange(num_rows, device="cuda") % 2 == 0)
    mixed = column(0.7)
    mixed[::4] = 0.0
    top_k = column(50, torch.int64)
    return {
        "greedy": SamplingBatch(temperature=column(0.0), all_greedy=True),
        "temperature": SamplingBatch(temperature=column(0.6), all_greedy=False),
        "mixed_greedy_seeded": SamplingBatch(temperature=mixed, all_greedy=False, **seeded),
        "top_k": SamplingBatch(temperature=column(0.7), all_greedy=False, top_k=top_k, max_top_k=50),
        "top_p": SamplingBatch(temperature=column(0.7), all_greedy=False, top_p=column(0.9)),
        "top_k_top_p_min_p": SamplingBatch(temperature=column(0.7), all_greedy=False, top_k=top_k, top_p=column(0.9),
                                           min_p=column(0.05), max_top_k=50, **seeded),
    }


@pytest.mark.parametrize("case", ["greedy", "temperature", "mixed_greedy_seeded", "top_k", "top_p",
                                  "top_k_top_p_min_p"])
def test_bf16_sampling_reads_nothing_on_the_host(case):
    """Under CUDA's sync debug mode "error", a device-to-host read or blocking copy in sample() raises."""
    num_rows = 256
    logits = (torch.randn(num_rows, VOCAB, device="cuda") * 3).bfloat16()
    batch = _bf16_batches(num_rows)[case]
    batch.generator = torch.Generator(device="cuda").manual_seed(0)
    sample(logits, batch)  # compiled before the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sample(logits, batch).token_ids
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.shape == (num_rows,) and int(tokens.max()) < VOCAB


@pytest.mark.parametrize("case", ["greedy", "temperature", "mixed_greedy_seeded", "top_k"])
def test_bf16_sampling_allocates_no_float_copy(case):
    """The peak memory of sample() stays far below the [R, V] float32 copy that converting would allocate."""
    num_rows = 256
    logits = (torch.randn(num_rows, VOCAB, device="cuda") * 3).bfloat16()
    batch = _bf16_batches(num_rows)[case]
    sample(logits, batch)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    sample(logits, batch)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    float_copy = num_rows * VOCAB * 4
    assert extra < float_copy // 4, f"{case}: sample() allocated {extra} bytes; a float32 copy is {float_copy}"


# ---------------------------------------------------------------------------------------------
# distributions (chi-square against float64, as tests/test_sampler.py does on the CPU path)

LOGITS = np.array([1.3, -0.4, 2.1, 0.2, -1.6, 0.9, -2.7, 1.7, -0.9, 0.5, -3.2, 1.0, -0.1, -2.1, 2.6, -1.2])


def _reference(temperature, top_k=0, top_p=1.0, min_p=0.0):
    z = LOGITS / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.ones(len(p), dtype=bool)
    order = np.argsort(-p, kind="stable")
    if top_k:
        keep[order[top_k:]] = False
    if top_p < 1:
        q = np.where(keep, p, 0.0) / np.where(keep, p, 0.0).sum()
        keep[order[(np.cumsum(q[order]) - q[order]) > top_p]] = False
    if min_p:
        keep &= p >= min_p * p.max()
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def _p_value(counts, probs):
    support = probs > 0
    observed, expected = counts[support], counts.sum() * probs[support]
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = len(expected) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


@pytest.mark.parametrize("params", [
    dict(temperature=0.7), dict(temperature=1.2, top_k=5), dict(temperature=1.0, top_p=0.6),
    dict(temperature=1.0, min_p=0.15), dict(temperature=0.9, top_k=6, top_p=0.8),
], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
def test_fused_draws_from_the_right_distribution(params, seeded):
    num_rows = 200_000
    logits = torch.tensor(LOGITS, dtype=torch.float32, device="cuda").expand(num_rows, -1).contiguous()
    column = lambda v, dtype=torch.float32: torch.full((num_rows,), v, dtype=dtype, device="cuda")  # noqa: E731
    batch = SamplingBatch(temperature=column(params["temperature"]), all_greedy=False,
                          generator=torch.Generator(device="cuda").manual_seed(1))
    if "top_k" in params:
        batch.top_k, batch.max_top_k = column(params["top_k"], torch.int64), params["top_k"]
    if "top_p" in params:
        batch.top_p = column(params["top_p"])
        batch.max_top_k = batch.max_top_k if "top_k" in params else None
    if "min_p" in params:
        batch.min_p = column(params["min_p"])
    if seeded:  # half the rows across seeds, half across positions of one seed
        half = num_rows // 2
        batch.seeds = torch.cat([torch.arange(half), torch.full((half,), 42)]).cuda()
        batch.positions = torch.cat([torch.zeros(half, dtype=torch.int64), torch.arange(half)]).cuda()
        batch.is_seeded = torch.ones(num_rows, dtype=torch.bool, device="cuda")
    token_ids = sample(logits, batch).token_ids.cpu().numpy()
    counts = np.bincount(token_ids, minlength=len(LOGITS))
    expected = _reference(**params)
    assert counts[expected == 0].sum() == 0
    assert _p_value(counts, expected) > 1e-4, (counts / num_rows, expected)
    wrong = _reference(**dict(params, temperature=params["temperature"] * 1.1))
    assert _p_value(counts, wrong) < 1e-4  # the same draws tell a nearby wrong distribution apart


def test_unseeded_rows_differ_between_steps_and_follow_the_generator():
    logits = torch.zeros(8, VOCAB, device="cuda")
    batch = lambda g: SamplingBatch(temperature=torch.ones(8, device="cuda"), all_greedy=False, generator=g)  # noqa: E731
    first = sample(logits, batch(torch.Generator(device="cuda").manual_seed(0))).token_ids
    again = sample(logits, batch(torch.Generator(device="cuda").manual_seed(0))).token_ids
    generator = torch.Generator(device="cuda").manual_seed(0)
    step1, step2 = sample(logits, batch(generator)).token_ids, sample(logits, batch(generator)).token_ids
    assert torch.equal(first, again) and torch.equal(first, step1)
    assert (step1 != step2).sum() >= 6
