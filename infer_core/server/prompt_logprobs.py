"""Prompt logprobs in completions responses: ``echo`` with ``logprobs`` (OpenAI's legacy form, which
lm-eval-harness scores loglikelihoods with) and vLLM's ``prompt_logprobs`` field.

With ``echo`` and ``logprobs``, the choice's ``logprobs`` lists every prompt token first (the first
with ``null``: nothing precedes it), then the generated ones; lm-eval sums
``token_logprobs[context_length:-1]``.
"""

from __future__ import annotations

from collections.abc import Callable

from infer_core.outputs import Logprob, RequestOutput
from infer_core.server.response_schemas import CompletionLogprobs, PromptTokenLogprob
from infer_core.server.responses import MIN_LOGPROB

FLOOR = MIN_LOGPROB  # as the completions logprobs: -inf is not JSON


def _top(entries: dict[int, Logprob], num_top: int) -> list[tuple[int, Logprob]]:
    ranked = [(tid, lp) for tid, lp in entries.items() if lp.rank is not None and 1 <= lp.rank <= num_top]
    return sorted(ranked, key=lambda item: item[1].rank)


def echoed_logprobs(output: RequestOutput, num_top: int, decode: Callable[[int], str]) -> CompletionLogprobs:
    """The prompt's part of a completions ``logprobs`` object: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for token_id, entries in zip(output.prompt_token_ids, output.prompt_logprobs or []):
        if entries is None:
            text, value, top = decode(token_id), None, None
        else:
            own = entries[token_id]
            text = own.decoded_token if own.decoded_token is not None else decode(token_id)
            value = max(own.logprob, FLOOR)
            top = {(lp.decoded_token if lp.decoded_token is not None else decode(tid)): max(lp.logprob, FLOOR)
                   for tid, lp in _top(entries, num_top)} or None
        tokens.append(text)
        token_logprobs.append(value)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens, token_logprobs, tops, offsets)


def joined(prompt_part: CompletionLogprobs, completion_part: CompletionLogprobs | None) -> CompletionLogprobs:
    """The prompt's logprobs followed by the completion's."""
    if completion_part is None:
        return prompt_part
    return CompletionLogprobs(prompt_part.tokens + completion_part.tokens,
                              prompt_part.token_logprobs + completion_part.token_logprobs,
                              prompt_part.top_logprobs + completion_part.top_logprobs,
                              prompt_part.text_offset + completion_part.text_offset)


def vllm_prompt_logprobs(output: RequestOutput) -> list[dict[str, PromptTokenLogprob] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt token, ``{token id: {logprob, rank, decoded_token}}`` or null."""
    if output.prompt_logprobs is None:
        return None
    return [None if entries is None else
            {str(tid): PromptTokenLogprob(max(lp.logprob, FLOOR), lp.rank, lp.decoded_token)
             for tid, lp in entries.items()}
            for entries in output.prompt_logprobs]
