"""The fused sampling kernel on CUDA at real shapes, and the distributions it draws from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from infer_core.layers.sampler import SamplingBatch, sample

pytestmark = pytest.mark.gpu

_spec = importlib.util.spec_from_file_location("fused_checks", Path(__file__).with_name("fused_checks.py"))
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)

VOCAB = 151936  # Qwen3's


@pytest.mark.parametrize("num_rows", [1, 3, 64, 256])
def test_fused_matches_reference_at_real_shapes(num_rows):
    checks.check_matches_reference("cuda", num_rows, VOCAB)


def test_ties_across_slices_on_cuda():
    checks.check_ties_across_slices("cuda", VOCAB)


def test_seeded_rows_ignore_the_batch_on_cuda():
    checks.check_seeded_rows_ignore_the_batch("cuda", VOCAB)


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
