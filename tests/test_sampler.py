"""SamplingParams validation and the sampler itself: distributions, penalties, min_tokens, logprobs.

Distribution checks draw many identical rows in one ``sample`` call and compare the frequencies
with the distribution computed here in float64 (chi-square).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from infer_core import SamplingParams
from infer_core.layers.sampler import SamplingBatch, apply_penalties, sample
from infer_core.runner.sampling_inputs import build_sampling_batch
from infer_core.runner.state import RequestState

ALPHA = 1e-4  # chi-square significance: a correct sampler fails this once in 10,000 seeds

# 16 logits in no particular order, so a sort or scatter mix-up cannot hide.
LOGITS = np.array([1.3, -0.4, 2.1, 0.2, -1.6, 0.9, -2.7, 1.7, -0.9, 0.5, -3.2, 1.0, -0.1, -2.1, 2.6, -1.2],
                  dtype=np.float32)
VOCAB = len(LOGITS)


# ---------------------------------------------------------------------------------------------
# SamplingParams validation


@pytest.mark.parametrize("kwargs, field, allowed", [
    (dict(temperature=-0.1), "temperature", ">= 0"),
    (dict(temperature=float("nan")), "temperature", ">= 0"),
    (dict(temperature=float("inf")), "temperature", ">= 0"),
    (dict(top_p=0.0), "top_p", "(0, 1]"),
    (dict(top_p=1.01), "top_p", "(0, 1]"),
    (dict(top_k=-2), "top_k", ">= 0"),
    (dict(top_k=2.5), "top_k", "integer"),
    (dict(min_p=-0.01), "min_p", "[0, 1]"),
    (dict(min_p=1.5), "min_p", "[0, 1]"),
    (dict(presence_penalty=2.01), "presence_penalty", "[-2, 2]"),
    (dict(presence_penalty=-3), "presence_penalty", "[-2, 2]"),
    (dict(frequency_penalty=-2.5), "frequency_penalty", "[-2, 2]"),
    (dict(frequency_penalty=7), "frequency_penalty", "[-2, 2]"),
    (dict(repetition_penalty=0.0), "repetition_penalty", "> 0"),
    (dict(repetition_penalty=-1.0), "repetition_penalty", "> 0"),
    (dict(max_tokens=0), "max_tokens", ">= 1"),
    (dict(max_tokens=-5), "max_tokens", ">= 1"),
    (dict(min_tokens=-1), "min_tokens", ">= 0"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens", "<= max_tokens (4)"),
    (dict(logprobs=21), "logprobs", "[0, 20]"),
    (dict(logprobs=-1), "logprobs", "[0, 20]"),
    (dict(n=0), "n", ">= 1"),
    (dict(stop=[""]), "stop", "non-empty"),
    (dict(stop=""), "stop", "non-empty"),
    (dict(stop=["ok", ""]), "stop", "non-empty"),
    (dict(stop_token_ids=[3, -1]), "stop_token_ids", ">= 0"),
    # a bool is no count: logprobs=True (the OpenAI chat flag) must not mean "1 top token"
    (dict(logprobs=True), "logprobs", "[0, 20]"),
    (dict(n=True), "n", ">= 1"),
    (dict(max_tokens=True), "max_tokens", ">= 1"),
    (dict(stop=123), "stop", "a string or a list of strings"),
    (dict(stop_token_ids=5), "stop_token_ids", "a list of token ids"),
])
def test_invalid_value_names_field_and_range(kwargs, field, allowed):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{field} must be"), message
    assert allowed in message, message


def test_valid_edges_are_accepted():
    assert SamplingParams(top_k=-1).top_k == 0  # -1 = off, as in vLLM
    assert SamplingParams(stop="###").stop == ["###"]
    for kwargs in (dict(temperature=0), dict(top_p=1.0), dict(top_p=1e-6), dict(min_p=0.0), dict(min_p=1.0),
                   dict(presence_penalty=-2, frequency_penalty=2), dict(repetition_penalty=1e-3),
                   dict(logprobs=0), dict(logprobs=20), dict(max_tokens=None, min_tokens=100),
                   dict(min_tokens=4, max_tokens=4), dict(seed=-7), dict(n=5)):
        SamplingParams(**kwargs)


# ---------------------------------------------------------------------------------------------
# the sampler's distribution (chi-square against a float64 reference computed here)


def reference_distribution(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, check_margins=True):
    """The distribution vLLM documents: temperature, then top-k, then top-p on what top-k kept
    (the smallest set of most likely tokens whose mass reaches top_p), and min-p relative to the
    most likely token."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.ones(len(p), dtype=bool)
    order = np.argsort(-p, kind="stable")
    if top_k > 0:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        q = np.where(keep, p, 0.0)
        q /= q.sum()
        mass_before = np.cumsum(q[order]) - q[order]
        if check_margins:  # a boundary within rounding of top_p would make the test ambiguous
            assert np.abs(mass_before[keep[order]] - top_p).min() > 1e-3
        keep[order[mass_before >= top_p]] = False
    if min_p > 0.0:
        if check_margins:
            assert np.abs(p / p.max() - min_p).min() > 1e-3
        keep &= p >= min_p * p.max()
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """P(X >= statistic) for X ~ chi2(bins - 1), via gammaincc; bins expecting fewer than 5
    draws are pooled (the chi-square approximation needs about 5 per bin)."""
    support = probs > 0
    n = counts.sum()
    observed, expected = counts[support].astype(np.float64), n * probs[support]
    pooled = expected < 5
    if pooled.any():
        if expected[pooled].sum() < 5:  # add the smallest bin that is large enough
            pooled[np.argsort(expected)[pooled.sum()]] = True
        observed = np.append(observed[~pooled], observed[pooled].sum())
        expected = np.append(expected[~pooled], expected[pooled].sum())
    assert len(expected) >= 2 and expected.min() >= 5, "too few draws for a chi-square test"
    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = len(expected) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def test_chi_square_helper_matches_known_quantiles():
    # 60/40 against a fair coin: statistic 4.0 on 1 degree of freedom, p = 0.0455
    assert chi_square_p_value(np.array([60, 40]), np.array([0.5, 0.5])) == pytest.approx(0.0455, abs=1e-4)
    # 30/30/40 against uniform: statistic 2.0 on 2 degrees of freedom, p = exp(-1)
    assert chi_square_p_value(np.array([30, 30, 40]), np.full(3, 1 / 3)) == pytest.approx(math.exp(-1), abs=1e-9)


def _column(value, num_rows, dtype=torch.float32):
    return torch.full((num_rows,), value, dtype=dtype)


def draw(num_rows: int, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
         seed: int = 0) -> np.ndarray:
    """Token counts of ``num_rows`` unseeded draws from LOGITS in one sampler call."""
    torch.manual_seed(seed)
    logits = torch.from_numpy(LOGITS).expand(num_rows, -1).clone()
    batch = SamplingBatch(temperature=_column(temperature, num_rows), all_greedy=False)
    if top_k:
        batch.top_k = _column(top_k, num_rows, torch.int64)
    if top_p < 1:
        batch.top_p = _column(top_p, num_rows)
    if min_p:
        batch.min_p = _column(min_p, num_rows)
    token_ids = sample(logits, batch).token_ids
    return np.bincount(token_ids.numpy(), minlength=VOCAB)


def assert_matches(counts: np.ndarray, expected: np.ndarray, wrong: np.ndarray | None = None) -> None:
    outside = np.flatnonzero((expected == 0) & (counts > 0))
    assert outside.size == 0, f"tokens {outside.tolist()} are outside the allowed set but were sampled"
    p_value = chi_square_p_value(counts, expected)
    assert p_value > ALPHA, f"chi-square p={p_value:.3g}: frequencies {counts / counts.sum()} vs {expected}"
    if wrong is not None:  # the same draws must tell a nearby wrong distribution apart
        assert chi_square_p_value(counts, wrong) < ALPHA


DISTRIBUTIONS = [
    dict(temperature=0.7),
    dict(temperature=1.5),
    dict(temperature=1.0, top_p=0.6),
    dict(temperature=0.8, top_p=0.9),
    dict(temperature=1.2, top_k=5),
    dict(temperature=1.0, min_p=0.15),
    dict(temperature=0.9, top_k=6, top_p=0.8),
    dict(temperature=1.3, top_k=8, min_p=0.18),
]


@pytest.mark.parametrize("params", DISTRIBUTIONS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_sampler_draws_from_the_right_distribution(params):
    counts = draw(100_000, **params)
    expected = reference_distribution(LOGITS, **params)
    shifted = dict(params, temperature=params["temperature"] * 1.1)
    assert_matches(counts, expected, wrong=reference_distribution(LOGITS, **shifted, check_margins=False))


def test_each_row_uses_its_own_parameters():
    """One call with interleaved rows of five settings (greedy among them): each row its own."""
    settings = [dict(temperature=0.7), dict(temperature=1.2, top_k=5), dict(temperature=1.0, top_p=0.6),
                dict(temperature=1.0, min_p=0.15), dict(temperature=0.0)]
    num_rows = 25_000 * len(settings)
    group = np.arange(num_rows) % len(settings)
    column = lambda name, off: torch.tensor([settings[g].get(name, off) for g in group])  # noqa: E731
    batch = SamplingBatch(temperature=column("temperature", 1.0).float(), all_greedy=False,
                          top_k=column("top_k", 0).long(), top_p=column("top_p", 1.0).float(),
                          min_p=column("min_p", 0.0).float())
    torch.manual_seed(1)
    token_ids = sample(torch.from_numpy(LOGITS).expand(num_rows, -1).clone(), batch).token_ids.numpy()
    for g, params in enumerate(settings):
        counts = np.bincount(token_ids[group == g], minlength=VOCAB)
        if params["temperature"] == 0:
            assert counts[int(LOGITS.argmax())] == counts.sum()
        else:
            assert_matches(counts, reference_distribution(LOGITS, **params))


def test_seeded_rows_draw_from_the_right_distribution():
    """A seed selects one stream per (seed, position); across seeds and across positions the
    draws must still follow the distribution."""
    num_rows = 20_000
    logits = torch.from_numpy(LOGITS).expand(num_rows, -1).clone()
    expected = reference_distribution(LOGITS, temperature=0.8)
    across_seeds = SamplingBatch(temperature=_column(0.8, num_rows), all_greedy=False,
                                 seeds=list(range(num_rows)), positions=[0] * num_rows)
    across_positions = SamplingBatch(temperature=_column(0.8, num_rows), all_greedy=False,
                                     seeds=[42] * num_rows, positions=list(range(num_rows)))
    for batch in (across_seeds, across_positions):
        counts = np.bincount(sample(logits, batch).token_ids.numpy(), minlength=VOCAB)
        assert_matches(counts, expected)


def test_seeded_row_does_not_depend_on_the_batch():
    generator = torch.Generator().manual_seed(3)
    num_seeded, vocab = 64, 50
    logits = torch.randn(num_seeded, vocab, generator=generator)
    seeds, positions = list(range(100, 100 + num_seeded)), [i % 7 for i in range(num_seeded)]
    alone = sample(logits, SamplingBatch(temperature=_column(1.0, num_seeded), all_greedy=False,
                                         seeds=seeds, positions=positions)).token_ids

    # the same rows, reversed, between unseeded rows that use top-k, top-p, min-p and greedy
    num_rows = 3 * num_seeded
    rows = torch.randn(num_rows, vocab, generator=generator)
    where = list(range(num_rows - 2, 0, -3))  # seeded row i sits at where[i]
    rows[where] = logits
    batch = SamplingBatch(temperature=torch.rand(num_rows, generator=generator) + 0.3, all_greedy=False,
                          top_k=torch.randint(0, 10, (num_rows,), generator=generator),
                          top_p=torch.full((num_rows,), 0.8), min_p=torch.full((num_rows,), 0.05),
                          seeds=[None] * num_rows, positions=[0] * num_rows)
    batch.temperature[::5] = 0.0
    for i, row in enumerate(where):
        batch.temperature[row], batch.top_k[row], batch.top_p[row], batch.min_p[row] = 1.0, 0, 1.0, 0.0
        batch.seeds[row], batch.positions[row] = seeds[i], positions[i]
    mixed = sample(rows, batch).token_ids[where]
    assert torch.equal(mixed, alone)
    # and the seed matters: other seeds (or positions) give other tokens
    moved = sample(logits, SamplingBatch(temperature=_column(1.0, num_seeded), all_greedy=False,
                                         seeds=[s + 1 for s in seeds], positions=positions)).token_ids
    assert (moved != alone).sum() > num_seeded // 2


def test_top_k_1_is_greedy_in_the_sampler():
    generator = torch.Generator().manual_seed(5)
    num_rows = 256
    logits = torch.randn(num_rows, 384, generator=generator) * 0.5
    batch = SamplingBatch(temperature=torch.full((num_rows,), 1.3), all_greedy=False,
                          top_k=torch.ones(num_rows, dtype=torch.int64))
    batch.top_k[1::2] = 0  # sampled rows beside them, so the batch is not all greedy
    token_ids = sample(logits, batch).token_ids
    assert torch.equal(token_ids[::2], logits[::2].argmax(dim=-1))
    assert (token_ids[1::2] != logits[1::2].argmax(dim=-1)).any()


def test_tiny_positive_temperature_is_greedy():
    """A temperature that overflows logits / temperature must not turn the row into NaNs."""
    logits = torch.tensor([[1.0, 2.0, 5.0, 3.0]] * 4)
    batch = SamplingBatch(temperature=torch.tensor([1e-6, 1e-30, 1e-39, 1e-45]), all_greedy=False)
    assert sample(logits, batch).token_ids.tolist() == [2, 2, 2, 2]
    for temperature in (1e-39, 1e-45):
        assert SamplingParams(temperature=temperature).is_greedy


# ---------------------------------------------------------------------------------------------
# penalties and min_tokens (on the sampler, with expectations computed by hand)


def _state(token_ids, num_prompt_tokens, **params) -> RequestState:
    return RequestState("r", list(token_ids), num_prompt_tokens, SamplingParams(**params), [], num_prompt_tokens)


def test_penalties_change_logits_as_documented():
    # prompt [0, 1], output [2, 2, 4]: seen = {0, 1, 2, 4}; output counts {2: 2, 4: 1}
    history = [0, 1, 2, 2, 4]
    row = [2.0, -1.0, 0.5, 0.0, 3.0, -2.0]
    states = [
        _state(history, 2, repetition_penalty=2.0),  # seen: positive / 2, negative * 2
        _state(history, 2, frequency_penalty=0.5),  # output tokens: - 0.5 * count
        _state(history, 2, presence_penalty=0.3),  # output tokens: - 0.3 once
        _state(history, 2, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.3),
        _state(history, 2, repetition_penalty=0.5, frequency_penalty=-1.0, presence_penalty=-0.25),
        _state(history, 2),  # no penalty: unchanged
    ]
    expected = torch.tensor([
        [1.0, -2.0, 0.25, 0.0, 1.5, -2.0],
        [2.0, -1.0, 0.5 - 1.0, 0.0, 3.0 - 0.5, -2.0],
        [2.0, -1.0, 0.5 - 0.3, 0.0, 3.0 - 0.3, -2.0],
        [1.0, -2.0, 0.25 - 1.0 - 0.3, 0.0, 1.5 - 0.5 - 0.3, -2.0],
        [4.0, -0.5, 1.0 + 2.0 + 0.25, 0.0, 6.0 + 1.0 + 0.25, -2.0],
        row,
    ])
    batch = build_sampling_batch(states, vocab_size=6, eos_token_ids=(), device=torch.device("cpu"))
    penalized = apply_penalties(torch.tensor([row] * len(states)), batch)
    torch.testing.assert_close(penalized, expected, rtol=0, atol=1e-6)


def test_penalties_steer_greedy_sampling():
    # token 4 leads by 0.4, but the output already holds it twice: frequency 0.5 drops it by 1.0
    logits = torch.tensor([[1.0, 0.0, 2.2, 0.0, 2.6, 0.0]] * 2)
    states = [_state([1, 4, 4], 1, temperature=0, frequency_penalty=0.5), _state([1, 4, 4], 1, temperature=0)]
    batch = build_sampling_batch(states, vocab_size=6, eos_token_ids=(), device=torch.device("cpu"))
    assert sample(logits, batch).token_ids.tolist() == [2, 4]


def test_min_tokens_bans_eos_and_stop_ids_in_the_sampler():
    eos, stop = 4, 5
    logits = torch.tensor([[0.0, 1.0, 0.5, 0.0, 9.0, 8.0]] * 4)
    states = [
        _state([1, 2, 3, 3], 2, temperature=0, min_tokens=3, stop_token_ids=[stop]),  # 2 outputs < 3
        _state([1, 2, 3, 3], 2, temperature=0, min_tokens=3, stop_token_ids=[stop], ignore_eos=True),
        _state([1, 2, 3, 3, 3], 2, temperature=0, min_tokens=3, stop_token_ids=[stop]),  # 3 outputs: free
        _state([1, 2, 3, 3], 2, temperature=0.7, min_tokens=3, stop_token_ids=[stop], seed=1),
    ]
    batch = build_sampling_batch(states, vocab_size=6, eos_token_ids=(eos,), device=torch.device("cpu"))
    token_ids = sample(logits, batch).token_ids.tolist()
    assert token_ids[0] == 1  # neither EOS (9.0) nor the stop id (8.0)
    assert token_ids[1] == eos  # ignore_eos: EOS is an ordinary token, only the stop id is banned
    assert token_ids[2] == eos
    assert token_ids[3] not in (eos, stop)


# ---------------------------------------------------------------------------------------------
# logprobs on the sampler: raw log_softmax of the logits, in float64


def test_sampler_logprobs_are_the_raw_log_softmax_with_ranks():
    generator = torch.Generator().manual_seed(9)
    num_rows, vocab, top_n = 8, 50, 5
    logits = torch.randn(num_rows, vocab, generator=generator) * 2
    batch = SamplingBatch(temperature=torch.tensor([0.0, 1.0, 0.7, 1.5, 1.0, 0.0, 2.0, 1.0]), all_greedy=False,
                          top_k=torch.tensor([0, 0, 3, 0, 0, 0, 0, 10]), max_num_logprobs=top_n,
                          seeds=list(range(num_rows)), positions=[0] * num_rows)
    out = sample(logits, batch)
    reference = torch.log_softmax(logits.double(), dim=-1)
    token_ids = out.token_ids
    expected = reference.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out.logprob.double(), expected, rtol=0, atol=1e-5)
    expected_rank = (reference > expected.unsqueeze(1)).sum(dim=-1) + 1
    assert out.rank.tolist() == expected_rank.tolist()
    assert out.rank[0] == 1 and out.rank[5] == 1  # greedy rows
    assert (out.rank > 1).any()  # some sampled token is not the most likely: the rank is not a constant
    top_values, top_ids = reference.topk(top_n, dim=-1)
    assert out.top_ids.tolist() == top_ids.tolist()
    torch.testing.assert_close(out.top_logprobs.double(), top_values, rtol=0, atol=1e-5)


def test_sampler_without_logprobs_returns_none():
    out = sample(torch.randn(2, 10), SamplingBatch(temperature=torch.zeros(2), all_greedy=True))
    assert out.logprob is None and out.top_ids is None
