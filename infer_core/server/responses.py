"""OpenAI response objects built from RequestOutputs: choices, logprobs, usage, stream events."""

from __future__ import annotations

from typing import Any

import msgspec

from infer_core.outputs import CompletionOutput, Logprob
from infer_core.server.response_schemas import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    PromptTokensDetails,
    TopLogprob,
    Usage,
)

DONE = b"data: [DONE]\n\n"
MIN_LOGPROB = -9999.0  # -inf has no JSON spelling; OpenAI clients read this as "never"

_encode = msgspec.json.Encoder().encode


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event; the payload may hold response structs."""
    return b"data: " + _encode(payload) + b"\n\n"


class ChunkFrame:
    """The SSE events of one streamed response: its fixed fields (id, object, created, model, and
    ``"usage": null`` when usage comes last) encoded once, each event only its choices.

    ``event(choice)`` gives the bytes ``sse({**base, "choices": [choice], **usage_null})`` gives.
    """

    def __init__(self, base: dict[str, Any], include_usage: bool) -> None:
        self._head = b"data: " + _encode(base)[:-1] + b',"choices":['
        self._tail = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"

    def event(self, choice: dict[str, Any]) -> bytes:
        return self._head + _encode(choice) + self._tail


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> Usage:
    details = PromptTokensDetails(cached_tokens) if cached_tokens else None
    return Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens, details)


def _new_logprobs(completion: CompletionOutput, delta_only: bool) -> list[tuple[int, dict[int, Logprob]]]:
    """(token id, its logprob entries) for the whole completion or for this step's tokens."""
    entries = completion.logprobs or []
    ids = completion.token_ids
    if delta_only:
        start = len(ids) - len(completion.delta_token_ids)
        return list(zip(ids[start:], entries[start:]))
    return list(zip(ids, entries))


def _top(entries: dict[int, Logprob], num_top: int) -> list[tuple[int, Logprob]]:
    ranked = [(tid, lp) for tid, lp in entries.items() if lp.rank is not None and 1 <= lp.rank <= num_top]
    return sorted(ranked, key=lambda item: item[1].rank)


def _token_text(token_id: int, lp: Logprob) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"<token {token_id}>"


def _logprob(lp: Logprob) -> float:
    return max(lp.logprob, MIN_LOGPROB)


def chat_logprobs(completion: CompletionOutput, num_top: int, delta_only: bool = False) -> ChatLogprobs | None:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`` as the chat API."""
    if completion.logprobs is None:
        return None
    content = []
    for token_id, entries in _new_logprobs(completion, delta_only):
        sampled = entries[token_id]
        text = _token_text(token_id, sampled)
        top = []
        for tid, lp in _top(entries, num_top):
            alternative = _token_text(tid, lp)
            top.append(TopLogprob(alternative, _logprob(lp), list(alternative.encode("utf-8"))))
        content.append(ChatTokenLogprob(text, _logprob(sampled), list(text.encode("utf-8")), top))
    return ChatLogprobs(content)


def completion_logprobs(completion: CompletionOutput, num_top: int, text_offset: int,
                        delta_only: bool = False) -> CompletionLogprobs | None:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` as the completions API."""
    if completion.logprobs is None:
        return None
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for token_id, entries in _new_logprobs(completion, delta_only):
        sampled = entries[token_id]
        text = _token_text(token_id, sampled)
        tokens.append(text)
        token_logprobs.append(_logprob(sampled))
        tops.append({_token_text(tid, lp): _logprob(lp) for tid, lp in _top(entries, num_top)} or None)
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens, token_logprobs, tops, offsets)
