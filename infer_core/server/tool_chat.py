"""What a chat request's tools and output constraints change on the chat route: the prompt, the
grammar, and each streamed choice's delta (tool calls split from the content)."""

from __future__ import annotations

from infer_core.outputs import CompletionOutput
from infer_core.sampling_params import StructuredOutputs
from infer_core.server.errors import bad_request
from infer_core.server.generation import PromptInput
from infer_core.server.prompt_bound import check_text
from infer_core.server.response_schemas import ToolCallDelta
from infer_core.server.schemas import ChatCompletionRequest, ChatMessage
from infer_core.server.state import ServerState, render_chat
from infer_core.server.tool_parsers import ToolCallStream, choose_parser
from infer_core.server.tools import ToolPlan


def _template(state: ServerState) -> str:
    template = getattr(state.tokenizer, "chat_template", None)
    return template if isinstance(template, str) else ""


def tool_plan(state: ServerState, body: ChatCompletionRequest) -> ToolPlan | None:
    """The request's tool plan (None: no tools); the parser is ``--tool-call-parser`` or the template's."""
    return body.tool_plan(choose_parser(_template(state), state.settings.tool_call_parser))


def structured_spec(body: ChatCompletionRequest, tools: ToolPlan | None) -> StructuredOutputs | None:
    """The grammar on the output: the request's own, or the one its tool choice implies (not both)."""
    spec = body.structured_spec()
    tool_spec = tools.constraint() if tools is not None else None
    if spec is not None and tool_spec is not None:
        raise bad_request(f"tool_choice={tools.mode!r} already fixes the output's format; leave out response_format "
                          "and the guided_* fields, or use tool_choice='auto'", param="tool_choice")
    return spec or tool_spec


def _with_tools_described(messages: list[ChatMessage], tools: ToolPlan) -> list[ChatMessage]:
    """The conversation with the tools in its system message (for templates that do not read ``tools``)."""
    described = tools.system_prompt()
    if messages and messages[0].role == "system":
        first = messages[0]
        return [ChatMessage(role="system", content=f"{first.text()}\n\n{described}"), *messages[1:]]
    return [ChatMessage(role="system", content=described), *messages]


def chat_prompt(state: ServerState, body: ChatCompletionRequest, tools: ToolPlan | None) -> PromptInput:
    """Render, bound and tokenize the conversation, with its tools (runs on the tokenizer thread)."""
    messages, kwargs = body.messages, body.template_kwargs()
    if tools is not None and tools.mode != "none":
        if "tools" in _template(state):
            kwargs = {**kwargs, "tools": tools.template_tools()}
        else:
            messages = _with_tools_described(messages, tools)
    text = render_chat(state, messages, body.add_generation_prompt is not False, kwargs)
    check_text(state.tokenizer, text, state.max_model_len, "the messages, formatted by the chat template, are",
               "messages")
    return PromptInput(text, state.tokenizer.encode(text, add_special_tokens=False))


def choice_delta(tools: ToolPlan | None, stream: ToolCallStream | None,
                 completion: CompletionOutput) -> tuple[str, list[ToolCallDelta], str | None]:
    """(content to send, tool-call deltas, finish reason or None) of one streamed choice's step."""
    finish_reason = completion.finish_reason if completion.finished else None
    if stream is None:
        return completion.delta_text, [], finish_reason
    text = stream.feed(completion.delta_text)
    if not completion.finished:
        return text, [], None
    rest, calls = tools.finish_stream(stream)
    if calls and finish_reason == "stop":
        finish_reason = "tool_calls"
    return text + rest, [call.to_delta(index) for index, call in enumerate(calls)], finish_reason
