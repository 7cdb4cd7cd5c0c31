"""Request fields this server knows of and does not implement: a 400 naming the field, never silence.

OpenAI's and vLLM's APIs define fields that change what is generated (beam search, ``suffix``,
``allowed_token_ids``, a request's own ``chat_template``, ...). A client that sends one expects its effect, so a value
other than the field's no-op default is refused with the field's name. Fields that do not change
the output (``user``, ``store``, ``metadata``, ``service_tier``) and fields no API defines stay
ignored, as OpenAI clients send some. ``/v1/models`` lists these fields (``unsupported_fields``).
They are checked before the body is validated (validation.py), so the 400 names the field even when
its value has another fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infer_core.server.errors import OpenAIError, bad_request

IsNoOp = Callable[[Any], bool]


def _empty(value: Any) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""


def _one_of(*no_ops: Any) -> IsNoOp:
    return lambda value: value is None or value in no_ops


# field -> when its value asks for nothing (then it is accepted); shared by chat and completions
COMMON: dict[str, IsNoOp] = {
    "use_beam_search": _empty,
    "length_penalty": _one_of(1, 1.0),
    "allowed_token_ids": lambda value: value is None,
    "bad_words": _empty,
    "logits_processors": _empty,
    "truncate_prompt_tokens": lambda value: value is None,
    "spaces_between_special_tokens": _one_of(True),
    "return_tokens_as_token_ids": _empty,
    "guided_whitespace_pattern": _empty,
    "guided_decoding_backend": _one_of("", "auto", "xgrammar"),
    "prompt_embeds": _empty,
    "kv_transfer_params": _empty,
    "vllm_xargs": _empty,
    "structural_tag": _empty,
}
CHAT: dict[str, IsNoOp] = {
    **COMMON,
    "functions": _empty,  # the pre-tools API: send tools
    "function_call": _empty,
    "audio": _empty,
    "modalities": lambda value: value is None or value == ["text"],
    "prediction": _empty,
    "web_search_options": _empty,
    "reasoning_effort": lambda value: value is None,
    "echo": _empty,
    "prompt_logprobs": lambda value: value is None,  # served on /v1/completions
    "continue_final_message": _empty,
    "chat_template": _empty,  # the server's template formats every conversation
    "documents": _empty,
    "mm_processor_kwargs": _empty,
}
COMPLETIONS: dict[str, IsNoOp] = {
    **COMMON,
    "suffix": _empty,
}

_HINTS = {"functions": "send tools instead", "function_call": "send tool_choice instead", "guided_decoding_backend": "the server's grammar backend "
          "is set with --grammar (INFER_GRAMMAR); leave this field out"}


def refuse_unsupported(data: Any, table: dict[str, IsNoOp]) -> None:
    """Raise a 400 naming the first field of ``table`` that ``data`` (the raw JSON body) sets to a value with
    an effect."""
    if not isinstance(data, dict):
        return
    for name, is_no_op in table.items():
        if name in data and not is_no_op(data[name]):
            hint = _HINTS.get(name)
            raise unsupported(name, hint)


def unsupported(name: str, hint: str | None = None) -> OpenAIError:
    return bad_request(f"{name} is not supported by this server{'; ' + hint if hint else ''} "
                       f"(GET /v1/models lists the fields it refuses)", param=name)


def unsupported_fields() -> dict[str, list[str]]:
    """For /v1/models: the fields each endpoint refuses when set."""
    return {"chat.completions": sorted(CHAT), "completions": sorted(COMPLETIONS)}
