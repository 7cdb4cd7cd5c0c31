"""InputProcessor: a prompt and its SamplingParams -> the core's requests (one per completion).

The frontend's half of adding a request, the same in one process (``Engine``) and across the
process boundary (``AsyncEngine``): check the parameters against the model (engine/request_checks.py),
tokenize or check the token ids, render a chat, resolve max_tokens against the context, and name
the n completions. Structured-output specs are compiled in the core, which owns the sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from infer_core.engine.core import CoreRequest
from infer_core.engine.request_checks import check_params
from infer_core.errors import RequestError
from infer_core.sampling_params import SamplingParams

Prompt = str | Sequence[int]


def completion_ids(request_id: str, params: SamplingParams) -> list[tuple[str, SamplingParams]]:
    """(id, params) of each of a request's n completions; one completion keeps the request's id."""
    if params.n == 1:
        return [(request_id, params)]
    return [(f"{i}_{request_id}", params.for_child(i)) for i in range(params.n)]


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    def tokenize(self, prompt: Prompt, add_special_tokens: bool) -> tuple[str | None, list[int]]:
        """The prompt's text (None for token ids) and its token ids, checked against the vocabulary."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer: send the prompt as token ids", param="prompt")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", param="prompt")
            return None, list(prompt)
        raise RequestError("a prompt is a string or a list of token ids", param="prompt")

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template: str | None = None, **template_kwargs: Any) -> str:
        """The chat as prompt text, through the model's (or the given) chat template."""
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer, so it cannot format a chat", param="messages")
        template = chat_template or self.tokenizer.chat_template
        if not template:
            raise RequestError("the model has no chat template; pass one with --chat-template (INFER_CHAT_TEMPLATE)",
                               param="messages")
        try:
            return self.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **template_kwargs)
        except Exception as e:
            raise RequestError(f"the chat template could not format these messages: {e}", param="messages") from None

    def sampling_params(self, params: SamplingParams | None) -> SamplingParams:
        params = params or SamplingParams()
        if params.top_k >= self.vocab_size:
            params = replace(params, top_k=0)  # keeping the whole vocabulary is no top-k at all (and fits int64)
        check_params(params, self.tokenizer, self.vocab_size)
        return params

    def core_requests(self, completions: list[tuple[str, SamplingParams]], prompt_ids: list[int],
                      params: SamplingParams, arrival_time: float, priority: int = 0) -> list[CoreRequest]:
        """The core's request of each completion; max_tokens resolved against max_model_len."""
        remaining = self.max_model_len - len(prompt_ids)
        max_tokens = min(params.max_tokens or remaining, max(remaining, 1))
        return [CoreRequest(cid, prompt_ids, cparams, max_tokens, arrival_time, priority)
                for cid, cparams in completions]
