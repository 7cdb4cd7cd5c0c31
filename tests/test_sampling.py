"""Sampling: parameter validation, the sampler's distributions, seeds, penalties, stops, logprobs, n.

Distribution checks draw many identical rows in one ``sample`` call and compare the frequencies
with the distribution computed here in float64 (chi-square); engine checks run a tiny real
checkpoint, whose prompts are token ids.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.layers.sampler import SamplingBatch, apply_penalties, sample
from infer_core.runner.sampling_inputs import build_sampling_batch
from infer_core.runner.state import RequestState
from infer_core.testing import make_tiny_checkpoint

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


# ---------------------------------------------------------------------------------------------
# through the engine, on a tiny real checkpoint


def _prompt(length: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % 380 + 3 for i in range(length)]


def _llm(path: str, **settings) -> LLM:
    """An engine on the tiny checkpoint with a small KV pool."""
    return LLM(path, **{"num_kv_blocks": 256, **settings})


def _completions(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny_path(tiny_checkpoint) -> str:
    return str(tiny_checkpoint("qwen3"))


def test_seeded_request_reproduces_across_batches_and_preemption(tiny_path):
    prompt = _prompt(17)
    seeded = SamplingParams(seed=1234, temperature=0.9, max_tokens=24, ignore_eos=True)
    alone = _completions(_llm(tiny_path), [prompt], seeded)[0]
    assert len(alone) == 24

    others = [
        (_prompt(3, 11), SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)),
        (_prompt(75, 5), SamplingParams(seed=7, temperature=0.6, top_p=0.9, max_tokens=20, ignore_eos=True)),
        (_prompt(100, 9), SamplingParams(temperature=1.2, top_k=20, max_tokens=24, ignore_eos=True)),
        (_prompt(30, 2), SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)),
        (_prompt(52, 4), SamplingParams(seed=1234, temperature=0.5, min_p=0.1, max_tokens=24, ignore_eos=True)),
    ]
    prompts = [p for p, _ in others[:2]] + [prompt] + [p for p, _ in others[2:]] + [prompt]
    params = [s for _, s in others[:2]] + [seeded] + [s for _, s in others[2:]] + [seeded]

    in_batch = _completions(_llm(tiny_path), prompts, params)
    assert in_batch[2] == alone and in_batch[-1] == alone

    chunked = _completions(_llm(tiny_path, max_num_batched_tokens=24), prompts, params)
    assert chunked[2] == alone and chunked[-1] == alone

    # 10 blocks of 16 tokens: every request fits alone (the largest needs 8), not all together
    engine = _llm(tiny_path, num_kv_blocks=10).engine
    for i, (p, s) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, s)
    preempted: dict[str, list[int]] = {}
    num_preemptions = {"2": 0, "6": 0}  # of the two seeded copies
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                preempted[output.request_id] = output.outputs[0].token_ids
        for request_id in num_preemptions:
            request = engine.scheduler.get(request_id)
            if request is not None:
                num_preemptions[request_id] = request.num_preemptions
    assert max(num_preemptions.values()) > 0  # a seeded copy was preempted and recomputed
    assert preempted["2"] == alone and preempted["6"] == alone

    other_seed = _completions(_llm(tiny_path), [prompt], SamplingParams(seed=1235, temperature=0.9, max_tokens=24,
                                                                       ignore_eos=True))[0]
    assert sum(a != b for a, b in zip(alone, other_seed)) > 12


def test_unseeded_sampling_follows_the_engine_seed_not_the_global_rng(tiny_path):
    import torch

    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    first = _completions(_llm(tiny_path, seed=3), [_prompt(9)], params)
    torch.manual_seed(999)
    torch.rand(1000)  # whatever the user's own code draws
    llm = _llm(tiny_path, seed=3)
    state = torch.get_rng_state()
    assert _completions(llm, [_prompt(9)], params) == first
    assert torch.equal(torch.get_rng_state(), state)  # and the engine drew nothing from the global RNG
    assert _completions(_llm(tiny_path, seed=4), [_prompt(9)], params) != first


def test_top_k_1_equals_greedy_through_the_engine(tiny_path):
    llm = _llm(tiny_path)
    prompts = [_prompt(n, n) for n in (4, 19, 66)]
    greedy = _completions(llm, prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for params in (SamplingParams(top_k=1, temperature=1.3, max_tokens=16, ignore_eos=True),
                   SamplingParams(top_k=1, temperature=0.7, seed=5, top_p=0.5, max_tokens=16, ignore_eos=True)):
        assert _completions(llm, prompts, params) == greedy
    sampled = _completions(llm, prompts, SamplingParams(temperature=1.3, seed=5, max_tokens=16, ignore_eos=True))
    assert sampled != greedy


def test_stop_token_ids_and_max_tokens_end_generation(tiny_path):
    llm = _llm(tiny_path)
    prompt = _prompt(9)
    params = SamplingParams(seed=21, temperature=1.0, max_tokens=16, ignore_eos=True)
    full = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert full.finish_reason == "length" and full.stop_reason is None and len(full.token_ids) == 16
    # the first token that did not occur before it, from the third on, becomes the stop id
    k = next(i for i in range(2, 16) if full.token_ids[i] not in full.token_ids[:i])
    stop_id = full.token_ids[k]
    stopped = llm.generate([prompt], SamplingParams(seed=21, temperature=1.0, max_tokens=16, ignore_eos=True,
                                                    stop_token_ids=[stop_id, 383]), use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == full.token_ids[: k + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id


def test_eos_ends_generation_unless_min_tokens_or_ignore_eos(tiny_path, tmp_path):
    prompt = _prompt(5)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    first = _completions(_llm(tiny_path), [prompt], greedy)[0][0]
    # the same random weights, with the greedy first token declared the end-of-sequence token
    llm = _llm(str(make_tiny_checkpoint("qwen3", tmp_path, eos_token_id=first)))
    ended = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    assert ended.token_ids == [first] and ended.finish_reason == "stop" and ended.stop_reason is None

    later = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, min_tokens=4),
                         use_tqdm=False)[0].outputs[0]
    assert first not in later.token_ids[:4] and len(later.token_ids) >= 5
    assert later.finish_reason == "length" or later.token_ids[-1] == first

    ignored = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    assert ignored.token_ids[0] == first and len(ignored.token_ids) == 6 and ignored.finish_reason == "length"


def test_min_tokens_holds_back_stop_token_ids(tiny_path):
    llm = _llm(tiny_path)
    stops = list(range(0, 300))  # most of the vocabulary: without min_tokens, generation ends at once
    prompts = [_prompt(8 + i, i) for i in range(6)]
    free = llm.generate(prompts, [SamplingParams(seed=s, temperature=1.0, max_tokens=12, stop_token_ids=stops)
                                  for s in range(6)], use_tqdm=False)
    assert any(len(o.outputs[0].token_ids) < 4 for o in free)
    held = llm.generate(prompts, [SamplingParams(seed=s, temperature=1.0, max_tokens=12, stop_token_ids=stops,
                                                 min_tokens=4) for s in range(6)], use_tqdm=False)
    eos = llm.engine.eos_token_ids
    lengths = []
    for output in held:
        completion = output.outputs[0]
        body = completion.token_ids[:4]
        assert len(body) == 4 and not set(body) & (set(stops) | eos), completion.token_ids
        if completion.finish_reason == "stop":
            assert completion.stop_reason == completion.token_ids[-1] and completion.stop_reason in stops
        lengths.append(len(completion.token_ids))
    assert 5 in lengths  # the stop ids come back right after min_tokens


def test_logprobs_through_the_engine_match_hf(tiny_path):
    from transformers import AutoModelForCausalLM

    prompt, top_n = _prompt(12), 4
    llm = _llm(tiny_path)
    outputs = llm.generate([prompt, prompt], [SamplingParams(temperature=0, max_tokens=8, logprobs=top_n),
                                              SamplingParams(temperature=1.0, seed=3, max_tokens=8, logprobs=top_n)],
                           use_tqdm=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    num_outside_top = 0
    for output in outputs:
        completion = output.outputs[0]
        ids = torch.tensor([prompt + completion.token_ids[:-1]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:].double()
        reference = torch.log_softmax(logits, dim=-1)
        assert len(completion.logprobs) == len(completion.token_ids)
        for position, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
            ref = reference[position]
            assert next(iter(entry)) == token  # the sampled token comes first
            sampled = entry[token]
            assert sampled.logprob == pytest.approx(ref[token].item(), abs=1e-4)
            lowest = int((ref > ref[token] + 1e-4).sum()) + 1
            highest = int((ref > ref[token] - 1e-4).sum()) + 1
            assert lowest <= sampled.rank <= highest
            top = sorted((lp for lp in entry.values() if lp.rank <= top_n), key=lambda lp: lp.rank)
            assert [lp.rank for lp in top] == list(range(1, top_n + 1))
            assert [lp.logprob for lp in top] == pytest.approx(ref.topk(top_n).values.tolist(), abs=1e-4)
            assert len(entry) == top_n + (sampled.rank > top_n)
            num_outside_top += sampled.rank > top_n
    assert outputs[0].outputs[0].logprobs[0][outputs[0].outputs[0].token_ids[0]].rank == 1
    assert num_outside_top > 0  # the sampled request drew tokens outside the top-N


def test_n_completions_have_distinct_seeds_and_indexes(tiny_path):
    llm = _llm(tiny_path)
    prompt = _prompt(10)
    params = SamplingParams(n=3, seed=500, temperature=0.9, max_tokens=12, ignore_eos=True)
    output = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.index for c in output.outputs] == [0, 1, 2]
    completions = [c.token_ids for c in output.outputs]
    assert len({tuple(c) for c in completions}) == 3
    # completion i is the request with seed + i: reproducible one by one
    singles = _completions(llm, [prompt] * 3, [SamplingParams(seed=500 + i, temperature=0.9, max_tokens=12,
                                                              ignore_eos=True) for i in range(3)])
    assert completions == singles
    unseeded = llm.generate([prompt], SamplingParams(n=4, temperature=1.0, max_tokens=12, ignore_eos=True),
                            use_tqdm=False)[0]
    assert len({tuple(c.token_ids) for c in unseeded.outputs}) == 4


def test_streamed_n_completions_carry_their_own_deltas(tiny_path):
    """Outputs kept from earlier steps must still show those steps' deltas (not the latest)."""
    engine = _llm(tiny_path).engine
    engine.add_request("req", _prompt(7), SamplingParams(n=2, seed=8, temperature=1.0, max_tokens=6,
                                                         ignore_eos=True))
    engine.add_request("other", _prompt(20), SamplingParams(max_tokens=3, ignore_eos=True))
    steps = []
    while engine.has_unfinished_requests():
        steps.extend(o for o in engine.step() if o.request_id == "req")
    final = steps[-1]
    assert final.finished and not any(o.finished for o in steps[:-1])
    for index in range(2):
        deltas = [step.outputs[index].delta_token_ids for step in steps]
        assert [t for d in deltas for t in d] == final.outputs[index].token_ids
        assert all(len(d) == 1 for d in deltas)
        assert [len(step.outputs[index].token_ids) for step in steps] == list(range(1, 7))
