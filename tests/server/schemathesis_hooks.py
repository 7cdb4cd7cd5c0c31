"""Schemathesis hooks for the run in test_openapi.py: every generated completion stays a few tokens long.

A body the schema allows may ask for thousands of tokens (``max_tokens`` up to the context, or none
on chat, which means "up to the context"): minutes per case on a CPU. Before each call, each such
count above ``GENERATED_TOKENS`` is lowered to it, and a missing one is set to it. Schemathesis
checks the body against the schema again after this hook, so a case stays positive or negative by
what is actually sent; only integers above the cap change, and a negative value stays negative.

The cap also keeps the two rules that JSON Schema cannot state (``min_tokens <= max_tokens``, and
prompt + ``max_tokens`` within the context; both in the fields' descriptions) from failing bodies
the schema allows: the run checks what the schema can say, and test_errors.py checks those two.
"""

from __future__ import annotations

from typing import Any

import schemathesis

GENERATED_TOKENS = 2
GENERATING = ("/v1/chat/completions", "/v1/completions")
COUNTS = ("max_tokens", "max_completion_tokens", "min_tokens")


def _is_count(value: Any) -> bool:
    """An integer as JSON Schema counts them: 2 and 2.0 alike."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    body = case.body
    if case.operation.path not in GENERATING or not isinstance(body, dict):
        return
    for name in COUNTS:
        if _is_count(body.get(name)) and body[name] > GENERATED_TOKENS:
            body[name] = GENERATED_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = GENERATED_TOKENS
    limit = body.get("max_completion_tokens") if case.operation.path == GENERATING[0] else None
    limit = limit if _is_count(limit) else body.get("max_tokens")
    if _is_count(limit) and limit >= 1 and _is_count(body.get("min_tokens")) and body["min_tokens"] > limit:
        body["min_tokens"] = limit
