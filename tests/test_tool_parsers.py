"""Tool calls out of text (Hermes and Llama 3 JSON), whole and streamed in every split, and the grammar that
``tool_choice`` required / named puts on the output."""

from __future__ import annotations

import json

import pytest

from infer_core.server.schemas import ChatCompletionRequest
from infer_core.server.tool_parsers import ToolCallStream, choose_parser, parse

NAMES = frozenset({"get_weather", "get_time"})
HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>{"name": "get_time", "arguments": {"city": "Oslo"}}</tool_call>')


def _calls(parsed):
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def test_hermes_calls_and_content():
    parsed = parse("hermes", HERMES, NAMES)
    assert _calls(parsed) == [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Oslo"})]
    assert parsed.content == "Let me check."


@pytest.mark.parametrize("text", [
    "No tools needed: 2 < 3.",
    '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>',  # not a declared tool
    '<tool_call>{"name": "get_time", "arguments": </tool_call>',  # not JSON
])
def test_text_that_is_not_a_valid_call_stays_text(text):
    parsed = parse("hermes", text, NAMES)
    assert parsed.tool_calls == [] and parsed.content == text


def test_llama3_json_calls():
    text = '<|python_tag|>{"name": "get_time", "parameters": {"city": "Lima"}}; {"name": "get_weather", "parameters": {}}'
    assert _calls(parse("llama3_json", text, NAMES)) == [("get_time", {"city": "Lima"}), ("get_weather", {})]
    assert parse("llama3_json", "Lima is in Peru.", NAMES).content == "Lima is in Peru."


@pytest.mark.parametrize("parser, text", [("hermes", HERMES), ("hermes", "plain <b>text</b> <tool"),
                                          ("llama3_json", '{"name": "get_time", "parameters": {"city": "Lima"}}'),
                                          ("llama3_json", "An answer in words.")])
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_in_any_split_reassembles_to_the_whole(parser, text, step):
    stream = ToolCallStream(parser, NAMES)
    shown = "".join(stream.feed(text[i:i + step]) for i in range(0, len(text), step))
    rest, calls = stream.finish()
    whole = parse(parser, text, NAMES)
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    assert (shown + rest).strip() == (whole.content or "").strip()
    assert "<tool_call>" not in shown and '{"name"' not in shown


def test_parser_follows_the_template_unless_set():
    assert choose_parser("{% if tools %}<tool_call>{% endif %}", None) == "hermes"
    assert choose_parser('{{- "<|python_tag|>" }}{"name": ..., "parameters": ...}', None) == "llama3_json"
    assert choose_parser("", "llama3_json") == "llama3_json"


def _plan(tool_choice, parallel=None):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
             {"type": "function", "function": {"name": "get_time"}}]
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "tools": tools,
                                                 "tool_choice": tool_choice, "parallel_tool_calls": parallel})
    return body.tool_plan("hermes")


def test_required_and_named_choices_are_grammars():
    required = json.loads(_plan("required").constraint().json)
    assert required["type"] == "array" and required["minItems"] == 1 and "maxItems" not in required
    assert [c["properties"]["name"]["enum"] for c in required["items"]["anyOf"]] == [["get_weather"], ["get_time"]]
    assert json.loads(_plan("required", parallel=False).constraint().json)["maxItems"] == 1
    named = _plan({"type": "function", "function": {"name": "get_weather"}})
    assert json.loads(named.constraint().json)["required"] == ["city"]
    assert _plan("auto").constraint() is None and _plan("none").constraint() is None
    message, finish = _plan("required").message('[{"name": "get_time", "arguments": {}}]', "stop")
    assert finish == "tool_calls" and message.content is None
    assert (message.tool_calls[0].function.name, message.tool_calls[0].function.arguments) == ("get_time", "{}")
