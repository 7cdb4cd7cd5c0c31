"""Speculative sampling is plain sampling in distribution, and seeded requests are reproducible.

The chi-square tests sample 2,400 completions of one prompt at temperature 0.8 and top-p 0.9; the
second token of each is verified against a draft (the token plain sampling gives most often there,
a point mass like an n-gram draft, so both acceptance and rejection occur often), the third is the
token after an accepted draft or after a rejection. A two-sample chi-square test over each
position's token counts must not tell speculative from plain sampling apart, and must tell them
apart when the policy accepts by a deliberately wrong rule.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from infer_core import LLM, SamplingParams

from infer_spec_decode.draft_policy import DraftDecoding
from infer_spec_decode.ngram_policy import NgramDecoding

NUM_SAMPLES = 2400
PARAMS = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=3, ignore_eos=True, n=NUM_SAMPLES)
PROMPT = list(range(3, 20))  # a block and one token: every completion but the first reads the block from the cache


def chi_square_p_value(a: list[int], b: list[int], min_count: int = 10) -> float:
    """Two-sample chi-square test of homogeneity over the tokens in ``a`` and ``b`` (rare tokens pooled)."""
    tokens = sorted(set(a) | set(b))
    counts = torch.tensor([[a.count(t), b.count(t)] for t in tokens], dtype=torch.float64)
    common = counts.sum(1) >= min_count
    table = torch.cat([counts[common], counts[~common].sum(0, keepdim=True)])
    table = table[table.sum(1) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    dof = table.shape[0] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


class FixedDraft(NgramDecoding):
    """The ngram policy's verification, with one draft token proposed at every request's second position."""

    draft_token = 0

    def propose(self, requests):
        return {r.request_id: [self.draft_token] for r in requests if r.num_output_tokens == 1}


class OverAccepting(FixedDraft):
    """The wrong rule: keeps a draft token with probability sqrt(p) instead of p."""

    def _uniform(self, request_id: str, j: int) -> float:
        return super()._uniform(request_id, j) ** 2


class OverAcceptingDraft(DraftDecoding):
    """The draft model's proposals, kept by the same wrong rule."""

    def _uniform(self, request_id: str, j: int) -> float:
        return super()._uniform(request_id, j) ** 2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Thousands of tiny per-request attention calls: threads would only wait on each other (on a loaded
    machine, for milliseconds a call). ``sample`` sets it again: a runner starts on one thread per core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(tiny_checkpoint):
    return str(tiny_checkpoint("qwen3", initializer_range=0.4))  # peaked: a few tokens carry most of the mass


def sample(folder: str, policy: type | None = None, draft_token: int = 0) -> tuple[list[list[int]], LLM]:
    """Completions' tokens by position; with ``policy`` a subclass of DraftDecoding, the target drafts for itself."""
    drafting = policy is not None and issubclass(policy, DraftDecoding)
    llm = LLM(folder, max_num_seqs=NUM_SAMPLES, max_num_batched_tokens=8192,
              decoding="standard" if policy is None else "draft" if drafting else "ngram",
              **({"speculative_model": folder, "num_speculative_tokens": 2} if drafting else {}))
    torch.set_num_threads(1)  # see one_thread
    if policy is not None:
        core = llm.engine.core  # the engine core owns the policy (the offline engine drives it in-process)
        core.decoding = policy(core.decoding.ctx)
        core.decoding.bind(core.executor)
        core.decoding.draft_token = draft_token
    [output] = llm.generate([PROMPT], PARAMS, use_tqdm=False)
    return [[c.token_ids[i] for c in output.outputs] for i in range(PARAMS.max_tokens)], llm


@pytest.fixture(scope="module")
def plain(folder):
    samples, _ = sample(folder)
    return samples, Counter(samples[1]).most_common(1)[0][0]


def test_speculative_sampling_has_the_plain_distribution(folder, plain):
    plain_samples, draft_token = plain
    samples, llm = sample(folder, FixedDraft, draft_token)
    stats = llm.engine.decoding.stats()
    assert stats.num_draft_tokens == NUM_SAMPLES and 0.2 < stats.acceptance_rate < 0.8  # accepts and rejects
    for position in (1, 2):
        assert chi_square_p_value(samples[position], plain_samples[position]) > 0.01


def test_a_wrong_acceptance_rule_is_caught(folder, plain):
    plain_samples, draft_token = plain
    samples, _ = sample(folder, OverAccepting, draft_token)
    assert chi_square_p_value(samples[1], plain_samples[1]) < 1e-4


def test_draft_model_sampling_has_the_plain_distribution(folder, plain):
    """The target as its own draft: its greedy token proposed at positions 1 and 2, accepted with p(token)."""
    plain_samples, _ = plain
    samples, llm = sample(folder, DraftDecoding)
    stats = llm.engine.decoding.stats()
    assert stats.num_drafts >= NUM_SAMPLES and 0.2 < stats.acceptance_rate < 0.9  # accepts and rejects
    for position in (1, 2):
        assert chi_square_p_value(samples[position], plain_samples[position]) > 0.01
    samples, _ = sample(folder, OverAcceptingDraft)
    assert chi_square_p_value(samples[1], plain_samples[1]) < 1e-4


def test_seeded_requests_are_reproducible_alone_or_batched(tiny_checkpoint):
    llm = LLM(str(tiny_checkpoint("qwen3")), decoding="ngram", num_speculative_tokens=3, prompt_lookup_min=1)
    torch.set_num_threads(1)  # see one_thread
    params = [SamplingParams(temperature=0.8, top_p=0.9, min_p=0.02, presence_penalty=0.3, max_tokens=24,
                             ignore_eos=True, seed=seed) for seed in range(6)]
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 7, [5, 6, 7, 8] * 6] * 2
    batched = llm.generate(prompts, params, use_tqdm=False)
    alone = [llm.generate([p], q, use_tqdm=False)[0] for p, q in zip(prompts[:2], params[:2])]
    assert [o.outputs[0].token_ids for o in alone] == [o.outputs[0].token_ids for o in batched[:2]]
    again = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in batched]
    assert llm.engine.decoding.stats().num_drafts > 0
