"""``best_of`` on /v1/completions: ``best_of`` completions are generated and the ``n`` with the highest
cumulative logprob (the sum over their tokens, from the model's raw distribution) are returned."""

from __future__ import annotations

from dataclasses import replace

from infer_core.outputs import CompletionOutput
from infer_core.sampling_params import SamplingParams


def with_candidates(params: SamplingParams, best_of: int) -> SamplingParams:
    """``params`` generating ``best_of`` candidates, each with its tokens' logprobs (to rank them)."""
    if best_of <= params.n:
        return params
    return replace(params, n=best_of, logprobs=params.logprobs if params.logprobs is not None else 0)


def cumulative_logprob(completion: CompletionOutput) -> float:
    return sum(entries[token].logprob for token, entries in zip(completion.token_ids, completion.logprobs or []))


def best_completions(candidates: list[CompletionOutput], n: int, keep_logprobs: bool) -> list[CompletionOutput]:
    """The ``n`` best candidates (ties: the earlier one), as choices 0..n-1; logprobs only when asked for."""
    ranked = sorted(candidates, key=lambda c: (-cumulative_logprob(c), c.index))[:n]
    return [replace(c, index=i, logprobs=c.logprobs if keep_logprobs else None) for i, c in enumerate(ranked)]
