"""Schemathesis hooks for the run in test_openapi.py: every generated completion stays a few tokens long.

A body the schema allows may ask for thousands of tokens (``max_tokens`` up to the context, or none
on chat, which means "up to the context"): minutes per case on a CPU. Before each call, each such
count above ``GENERATED_TOKENS`` is lowered to it, and a missing one is set to it. Schemathesis
checks the body against the schema again after this hook, so a case stays positive or negative by
what is actually sent; only integers above the cap change, and a negative value stays negative.

The cap also keeps the two rules that JSON Schema cannot state (``min_tokens <= max_tokens``, and
prompt + ``max_tokens`` within the context; both in the fields' descriptions) from failing bodies
the schema allows: the run checks what the schema can say, and test_errors.py checks those two.
Three more such rules are kept the same way: ``best_of`` is at least ``n`` (and ``n`` when streaming);
a named ``tool_choice`` names one of ``tools``; a regular expression, an EBNF grammar or a JSON
schema's text is one the grammar engine compiles (a random string is none of these). Each value
that breaks one is replaced by one that keeps it (tests/test_structured_outputs.py and
tests/server/test_structured_server.py check the 400s of those that do not).
"""

from __future__ import annotations

from typing import Any

import schemathesis

GENERATED_TOKENS = 2
GENERATING = ("/v1/chat/completions", "/v1/completions")
COUNTS = ("max_tokens", "max_completion_tokens", "min_tokens")
REGEX, GRAMMAR, SCHEMA_TEXT = r"[a-z]{1,3}", 'root ::= "yes" | "no"', '{"type": "object"}'


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

    _keep_cross_field_rules(body)


def _keep_cross_field_rules(body: dict[str, Any]) -> None:
    n = body.get("n") if _is_count(body.get("n")) else 1
    if _is_count(body.get("best_of")) and (body["best_of"] < n or body.get("stream") is True):
        body["best_of"] = n
    tools, choice = body.get("tools"), body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) and isinstance(tools, list) and tools:
        first = tools[0].get("function") if isinstance(tools[0], dict) else None
        if isinstance(first, dict) and isinstance(first.get("name"), str):
            choice["function"]["name"] = first["name"]
    for holder, key, value in _grammar_texts(body):
        holder[key] = value


def _grammar_texts(body: dict[str, Any]):
    """(object, key, compilable value) for each grammar given as text."""
    structured = body.get("structured_outputs")
    for holder, prefix in ((body, "guided_"), (structured if isinstance(structured, dict) else {}, "")):
        if isinstance(holder.get(prefix + "regex"), str):
            yield holder, prefix + "regex", REGEX
        if isinstance(holder.get(prefix + "grammar"), str):
            yield holder, prefix + "grammar", GRAMMAR
        if isinstance(holder.get(prefix + "json"), str):
            yield holder, prefix + "json", SCHEMA_TEXT
