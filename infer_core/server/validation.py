"""A decoded body validated as its request model, each failure a 400 that names the field.

Two things pydantic does not do: a field name that is a near-miss of one the server reads
(``max_token``, ``maxTokens``, ``max_new_tokens``) is a 400 with "did you mean", since unknown
fields are otherwise ignored and a misspelt one would silently do nothing; and of the errors a
union collects, the one message that helps is chosen (the branch that got furthest).
"""

from __future__ import annotations

import difflib
import json
import math
import re
import types
import typing
from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from infer_core.server.errors import OpenAIError, bad_request
from infer_core.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from infer_core.server.unsupported import CHAT, COMPLETIONS, refuse_unsupported

Model = TypeVar("Model", bound=BaseModel)

# Fields of OpenAI's and vLLM's APIs that this server does not read and that do not change the output:
# ignored like any unknown field, never taken for a misspelling of one it reads. The fields that would
# change the output are refused by name (unsupported.py, checked first).
OTHER_API_FIELDS = frozenset({
    "metadata", "prompt_cache_key", "safety_identifier", "service_tier", "store", "verbosity", "cache_salt",
    "chat_template", "request_id", "return_token_ids", "refusal", "reasoning", "reasoning_content",
    "add_special_tokens"})

# the fields of this server's other routes: a chat field sent to /v1/completions (top_logprobs beside
# logprobs) is ignored there as before, not taken for a misspelling
OWN_FIELDS = frozenset(name for model in (ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest)
                       for name in model.model_fields)

UNSUPPORTED = {ChatCompletionRequest: CHAT, CompletionRequest: COMPLETIONS}
REFUSED = frozenset(CHAT) | frozenset(COMPLETIONS)  # refused where they change the output, never typos

TYPO_CUTOFF = 0.8  # difflib's similarity ratio above which an unknown name is taken for a misspelling
# pydantic names the union member it tried in ``loc`` ("str", "list[int]", "constrained-str"): not fields
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|list|dict|json-or-python|constrained-\w+|.*\[.*\])$")


def validate(model: type[Model], data: dict[str, Any]) -> Model:
    """``data`` as ``model``, its cross-field rules checked; 400 naming the field otherwise."""
    refuse_unsupported(data, UNSUPPORTED.get(model, {}))
    _check_names(model, data, ())
    try:
        body = model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
    body.check()
    return body


def _normal(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def did_you_mean(name: str, known: typing.Iterable[str]) -> str | None:
    """The known name ``name`` most likely misspells, if any."""
    known = list(known)
    for candidate in known:
        if _normal(candidate) == _normal(name):
            return candidate
    close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=TYPO_CUTOFF)
    return close[0] if close else None


def _check_names(model: type[BaseModel], data: Any, path: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        return
    fields = _names(model)
    for key in data:
        if (key in fields or key in OTHER_API_FIELDS or (not path and key in OWN_FIELDS | REFUSED)
                or not isinstance(key, str)):
            continue
        if (match := did_you_mean(key, fields)) is not None:
            where = ".".join((*path, key))
            raise bad_request(f"unknown field {where!r}: did you mean {match!r}? (fields this server does not "
                              f"know are ignored, so a misspelt one would do nothing)", param=where)
    for name, nested in _nested_models(model).items():
        value = data.get(name)
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            where = (*path, name) if index is None else (*path, name, str(index))
            for sub in nested:
                _check_names(sub, item, where)


@cache
def _names(model: type[BaseModel]) -> frozenset[str]:
    """The keys a body may use for the model's fields: their names, and their aliases (``schema``, ``json``)."""
    return frozenset(info.alias or name for name, info in model.model_fields.items())


@cache
def _nested_models(model: type[BaseModel]) -> dict[str, tuple[type[BaseModel], ...]]:
    """For each field, the request models its value (or its list's items) may be."""
    found = {}
    for name, info in model.model_fields.items():
        models = tuple(_models_in(info.annotation))
        if models:
            found[info.alias or name] = models
    return found


def _models_in(annotation: Any) -> typing.Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin is list or origin is typing.Union or origin is types.UnionType or origin is typing.Annotated:
        args = typing.get_args(annotation)
        for arg in args[:1] if origin is typing.Annotated else args:
            yield from _models_in(arg)


def _clean(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(p for p in loc if not _is_tag(p))


def _shown(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):  # 1e400 parses as inf
        return "a number beyond a double's range"
    if isinstance(value, list | dict) and len(value) > 4:
        return f"an {'array' if isinstance(value, list) else 'object'} of {len(value)} items"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def validation_error(error: ValidationError) -> OpenAIError:
    """The error that helps most: a broken rule over a wrong type, then the deepest field, then the furthest item."""
    errors = error.errors()
    broken = [e for e in errors if not e["type"].endswith("_type")] or errors

    def progress(e: dict[str, Any]) -> tuple[int, int]:
        loc = _clean(e["loc"])
        return len(loc), loc[-1] if loc and isinstance(loc[-1], int) else -1

    best = max(broken, key=progress)
    loc = _clean(best["loc"])
    param = ".".join(str(p) for p in loc) or None
    if best["type"] == "missing":
        return bad_request(f"{param} is required", param=param)
    members = [e["loc"][-1] for e in broken if _clean(e["loc"]) == loc and _is_tag(e["loc"][-1])]
    if best["type"].endswith("_type") and len(members) > 1:  # no member of a union took the value
        kinds = [m.replace("constrained-", "") for m in members]  # "list[constrained-int]" reads "list[int]"
        message = f"expected {', '.join(kinds[:-1])} or {kinds[-1]}"
    else:
        message = str(best["msg"]).removeprefix("Value error, ")
    if "got " not in message:
        message += f" (got {_shown(best.get('input'))})"
    return bad_request(f"{param}: {message}" if param else message, param=param)


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and _UNION_TAG.match(part) is not None
