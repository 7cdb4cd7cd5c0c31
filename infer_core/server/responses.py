"""OpenAI response objects built from RequestOutputs: choices, logprobs, usage, stream chunks."""

from __future__ import annotations

import json
from typing import Any

from infer_core.outputs import CompletionOutput, Logprob

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


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


def chat_logprobs(completion: CompletionOutput, num_top: int, delta_only: bool = False) -> dict[str, Any] | None:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`` as the chat API."""
    if completion.logprobs is None:
        return None

    def item(token_id: int, lp: Logprob) -> dict[str, Any]:
        text = _token_text(token_id, lp)
        return {"token": text, "logprob": max(lp.logprob, -9999.0), "bytes": list(text.encode("utf-8"))}

    content = []
    for token_id, entries in _new_logprobs(completion, delta_only):
        sampled = entries[token_id]
        top = [item(tid, lp) for tid, lp in _top(entries, num_top)]
        content.append({**item(token_id, sampled), "top_logprobs": top})
    return {"content": content}


def completion_logprobs(completion: CompletionOutput, num_top: int, text_offset: int,
                        delta_only: bool = False) -> dict[str, Any] | None:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` as the completions API."""
    if completion.logprobs is None:
        return None
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for token_id, entries in _new_logprobs(completion, delta_only):
        sampled = entries[token_id]
        text = _token_text(token_id, sampled)
        tokens.append(text)
        token_logprobs.append(max(sampled.logprob, -9999.0))
        tops.append({_token_text(tid, lp): max(lp.logprob, -9999.0) for tid, lp in _top(entries, num_top)} or None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
