"""Response bodies of every route, as msgspec structs: built on each request, encoded without a copy.

Structs cost next to nothing to build (no validation pass over the server's own output) and Litestar
encodes them natively; /openapi.json describes them with msgspec's JSON Schema generator. Fields with
a default are left out of the JSON when they hold it (``omit_defaults``), as OpenAI leaves out
``prompt_tokens_details`` when nothing was cached.
"""

from __future__ import annotations

from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "abort", "tool_calls"]  # tool_calls: stopped after calling tools


class _Out(msgspec.Struct, omit_defaults=True):
    pass


class PromptTokensDetails(_Out):
    cached_tokens: int


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # when some prompt tokens came from the prefix cache


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[ChatTokenLogprob]


class CalledFunction(_Out):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(_Out):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ToolCallDelta(_Out):
    """A streamed call: each call comes whole, in the choice's last chunk."""

    index: int
    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(_Out):
    role: Literal["assistant"]
    content: str | None  # null when the output is tool calls only
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Out):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(_Out):
    role: Literal["assistant"] | None = None  # in each choice's first chunk
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Out):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Out):
    """One ``data:`` event of a chat stream; with stream_options.include_usage, a last chunk with no choices."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(_Out):
    """With echo, the prompt's tokens first: the first has no logprob (nothing precedes it)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptTokenLogprob(_Out):
    logprob: float
    rank: int | None
    decoded_token: str | None


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None  # null only in stream chunks before the last
    # vLLM's prompt_logprobs: per prompt token, {token id: its logprob} (the first token: null)
    prompt_logprobs: list[dict[str, PromptTokenLogprob] | None] | None = None


class Completion(_Out):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(_Out):
    """One ``data:`` event of a completions stream; with stream_options.include_usage, a last chunk with no choices."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelFeatures(_Out):
    """What chat and completions implement beyond sampling, and the fields they refuse when set."""

    response_format: list[str]
    structured_outputs: list[str]  # also as vLLM's guided_<name> fields
    tool_choice: list[str]
    tool_call_parsers: list[str]
    unsupported_fields: dict[str, list[str]]  # endpoint -> fields refused with a 400 when set


class ModelCard(_Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: None
    max_model_len: int | None = None  # once the model is loaded
    features: ModelFeatures | None = None


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(_Out):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(_Out):
    prompt: str


class Health(_Out):
    """200 ``ok``; 503 while loading, draining, dead, stopped, or stalled (a step ran for too long)."""

    status: Literal["ok", "loading", "draining", "dead", "stopped", "stalled"]
    detail: str | None = None


class ChosenImplementation(_Out):
    name: str
    distribution: str
    version: str


class LoadedPlugin(_Out):
    name: str
    distribution: str
    version: str


class ImplementationStatus(_Out):
    kind: str
    name: str
    aliases: list[str]
    distribution: str
    version: str
    can_run: bool
    reasons: list[str]
    selected: bool


class PluginsReport(_Out):
    object: Literal["plugins"]
    model: str
    architecture: str
    device: str
    dtype: str
    block_size: int
    chosen: dict[str, ChosenImplementation]
    plugins: list[LoadedPlugin]
    implementations: list[ImplementationStatus]


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    """OpenAI's error envelope, the body of every 4xx and 5xx (but /health's 503)."""

    error: ErrorDetail
