"""Tool calls out of generated text: the Hermes/Qwen ``<tool_call>`` format and Llama 3's JSON format.

Hermes (Qwen2.5, Qwen3, Hermes, SmolLM3 templates) wraps each call in
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; Llama 3.x answers a bare
``{"name": ..., "parameters": {...}}`` (several joined by ``;``, optionally after ``<|python_tag|>``).
A call names a declared tool or it stays text. ``parse`` gives the content and the calls of a whole
output; ``ToolCallStream`` gives the same split as deltas while the output streams, holding back only
text that may still turn out to be a call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from infer_core.server.response_schemas import (
    CalledFunction,
    ToolCallDelta,
    ToolCallOut,
)

PARSERS = ("hermes", "llama3_json")
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> ToolCallOut:
        return ToolCallOut(self.id, "function", CalledFunction(self.name, self.arguments))

    def to_delta(self, index: int) -> ToolCallDelta:
        return ToolCallDelta(index, self.id, "function", CalledFunction(self.name, self.arguments))


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ToolCall]


def _call(obj: Any, names: frozenset[str]) -> ToolCall | None:
    """A call from a decoded JSON object, when it names a declared tool."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models send the arguments already as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _json_values(text: str) -> list[Any] | None:
    """Every JSON value in ``text``, separated by blanks or ``;`` (None when anything else is there)."""
    decoder = json.JSONDecoder()
    values, position = [], 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] == ";"):
            position += 1
        if position == len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            return None
        values.append(value)


def parse_hermes(text: str, names: frozenset[str]) -> ParsedOutput:
    calls, pieces, position = [], [], 0
    for match in _HERMES_CALL.finditer(text):
        values = _json_values(match.group(1))
        found = [_call(v, names) for v in values] if values else [None]
        if all(found):
            pieces.append(text[position:match.start()])
            calls.extend(found)
            position = match.end()
    pieces.append(text[position:])
    content = "".join(pieces).strip() if calls else text
    return ParsedOutput(content or None, calls)


def parse_llama3_json(text: str, names: frozenset[str]) -> ParsedOutput:
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    values = _json_values(body) if body.startswith("{") else None
    if values:
        found = [_call(v, names) for v in values]
        if all(found):
            return ParsedOutput(None, found)
    return ParsedOutput(text or None, [])


def parse(parser: str, text: str, names: frozenset[str]) -> ParsedOutput:
    """The content and tool calls of a whole output."""
    return parse_hermes(text, names) if parser == "hermes" else parse_llama3_json(text, names)


def choose_parser(chat_template: str | None, setting: str | None) -> str:
    """The parser of ``--tool-call-parser``, else the one the chat template's format implies (Hermes by default)."""
    if setting:
        return setting
    template = chat_template or ""
    if HERMES_START not in template and (PYTHON_TAG in template or '"parameters"' in template):
        return "llama3_json"
    return "hermes"


class ToolCallStream:
    """Splits a streamed output into content deltas and tool calls, as ``parse`` splits the whole of it.

    ``feed(delta)`` returns the content that can be shown now; ``finish()`` parses what was held back
    and returns (the rest of the content, the calls). Content is held back from the first character that
    may start a call; a Llama 3 output that starts with ``{`` is held whole.
    """

    def __init__(self, parser: str, names: frozenset[str], hold_all: bool = False) -> None:
        self.parser, self.names = parser, names
        self.hold_all = hold_all  # tool_choice required or a named function: the whole output is the call
        self.text = ""  # everything generated so far
        self.shown = 0  # characters of text already sent as content
        self.holding = hold_all  # from ``shown`` on, nothing is sent until finish

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.holding:
            return ""
        if self.parser == "llama3_json":
            stripped = self.text.lstrip()
            if not stripped or stripped.startswith("{") or PYTHON_TAG.startswith(stripped[:len(PYTHON_TAG)]):
                self.holding = bool(stripped)
                return ""
            return self._show(len(self.text))
        start = self.text.find(HERMES_START, self.shown)
        if start >= 0:
            self.holding = True
            return self._show(start)
        return self._show(len(self.text) - _partial_suffix(self.text, HERMES_START))

    def _show(self, end: int) -> str:
        piece = self.text[self.shown:end] if end > self.shown else ""
        self.shown = max(self.shown, end)
        return piece

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not yet sent, the tool calls) once the output is complete: what was held back, parsed."""
        if self.hold_all:
            return "", []  # the caller turns the whole output into the call (tools.ToolPlan)
        parsed = parse(self.parser, self.text[self.shown:], self.names)
        return parsed.content or "", parsed.tool_calls


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0
