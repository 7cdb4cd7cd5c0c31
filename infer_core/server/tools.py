"""Tool calling on /v1/chat/completions: ``tools`` and ``tool_choice`` in, ``tool_calls`` out.

The tools reach the chat template as its ``tools`` variable; a template that does not read them gets
them in a system message instead (Hermes's wording), so the model sees them either way. What comes
back is parsed into ``tool_calls`` (tool_parsers.py). ``tool_choice="required"`` and a named function
are enforced by the grammar: the output is a JSON list of calls (``[{"name", "arguments"}]``) or the
named function's arguments, each validated against the function's ``parameters`` schema, so even a
small model returns a call that parses. ``"none"`` leaves the output as text.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr

from infer_core.sampling_params import StructuredOutputs
from infer_core.server.errors import bad_request
from infer_core.server.request_types import RequestModel, conditional
from infer_core.server.response_schemas import AssistantMessage
from infer_core.server.structured import asks_grammar
from infer_core.server.tool_parsers import ParsedOutput, ToolCall, ToolCallStream, parse

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


FunctionName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="OpenAI's function names")]


class FunctionDefinition(RequestModel):
    name: FunctionName
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments object")
    strict: StrictBool | None = Field(None, description="accepted; forced calls always validate the parameters")


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class ChosenFunction(RequestModel):
    name: FunctionName


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: ChosenFunction = Field(description="one of tools, by name")


_FORCED = {"anyOf": [{"const": "required"}, {"type": "object"}]}  # a tool_choice that forces a call


# JSON Schema: a forced call needs tools, and fixes the output's format, so it goes with no grammar field
TOOL_RULES = [conditional("tool_choice", _FORCED, {"required": ["tools"], "properties": {"tools": {"minItems": 1}}}),
              conditional("tool_choice", _FORCED, {"not": asks_grammar()})]


class ToolFields(RequestModel):
    """The chat request's tool fields (their rules across fields: ``TOOL_RULES``)."""

    tools: list[Tool] | None = Field(None, description="functions the model may call")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="none, auto (default with tools), required, or a named function of tools")
    parallel_tool_calls: StrictBool | None = Field(None, description="false: at most one call")

    def tool_plan(self, parser: str) -> ToolPlan | None:
        """How this request uses its tools (None: it sends none); 400 for a choice that names no tool."""
        choice = self.tool_choice
        if not self.tools:
            if choice not in (None, "none", "auto"):
                raise bad_request("tool_choice needs tools: send the functions the model may call", param="tool_choice")
            return None
        functions = {t.function.name: t.function for t in self.tools}
        named = None
        if isinstance(choice, NamedToolChoice):
            named = choice.function.name
            if named not in functions:
                close = difflib.get_close_matches(named, list(functions), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; the tools are {', '.join(functions)}"
                raise bad_request(f"tool_choice names the function {named!r}, which is not among tools{hint}",
                                  param="tool_choice")
        mode = "named" if named else (choice or "auto")
        return ToolPlan(mode, functions, named, parser, self.parallel_tool_calls is not False)


def _parameters(function: FunctionDefinition) -> dict[str, Any]:
    return function.parameters if function.parameters else EMPTY_PARAMETERS


@dataclass(frozen=True, slots=True)
class ToolPlan:
    mode: str  # none, auto, required, named
    functions: dict[str, FunctionDefinition]
    named: str | None
    parser: str
    parallel: bool

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.functions)

    def template_tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in self.functions.values()]

    def system_prompt(self) -> str:
        """The tools described for a template that does not read ``tools`` (Hermes's wording)."""
        tools = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.template_tools())
        return ("You may call one or more functions to assist with the user query. The functions are:\n"
                f"<tools>\n{tools}\n</tools>\nFor each function call, return a JSON object with the function name "
                'and arguments within <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, '
                '"arguments": <args-json-object>}\n</tool_call>')

    def constraint(self) -> StructuredOutputs | None:
        """The grammar a required or named choice puts on the output (None: free text)."""
        if self.mode == "named":
            return StructuredOutputs(json=_parameters(self.functions[self.named]))
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                                   "arguments": _parameters(f)},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for name, f in self.functions.items()]
        schema: dict[str, Any] = {"type": "array", "minItems": 1,
                                  "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutputs(json=schema)

    def parse(self, text: str) -> ParsedOutput:
        """The content and calls of a whole output."""
        if self.mode == "named":
            return ParsedOutput(None, [ToolCall(self.named, _compact(text))])
        if self.mode == "required":
            try:
                calls = json.loads(text)
            except ValueError:
                return ParsedOutput(text or None, [])  # cut off by max_tokens: what came, as text
            return ParsedOutput(None, [ToolCall(c["name"], json.dumps(c["arguments"], ensure_ascii=False))
                                       for c in calls])
        if self.mode == "none":
            return ParsedOutput(text, [])
        return parse(self.parser, text, self.names)

    def stream(self) -> ToolCallStream | None:
        """A splitter for one streamed choice (None: the output is plain content)."""
        if self.mode == "none":
            return None
        return ToolCallStream(self.parser, self.names, hold_all=self.mode in ("named", "required"))

    def finish_stream(self, stream: ToolCallStream) -> tuple[str, list[ToolCall]]:
        """(content not yet sent, the calls) of a streamed choice once it is complete."""
        if stream.hold_all:
            parsed = self.parse(stream.text)
            return parsed.content or "", parsed.tool_calls
        return stream.finish()

    def message(self, text: str, finish_reason: str | None) -> tuple[AssistantMessage, str | None]:
        """(the assistant message, the finish reason) of a whole output."""
        parsed = self.parse(text)
        if not parsed.tool_calls:
            return AssistantMessage("assistant", parsed.content), finish_reason
        calls = [c.to_openai() for c in parsed.tool_calls]
        return (AssistantMessage("assistant", parsed.content, calls),
                "tool_calls" if finish_reason == "stop" else finish_reason)


def _compact(text: str) -> str:
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text  # cut off by max_tokens: the arguments as they came
