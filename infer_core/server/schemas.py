"""Request bodies of the OpenAI-compatible API, as pydantic models; /openapi.json is generated from them.

The constraints here are the server's own (SamplingParams' ranges, OpenAI's limits), so a body the
schema allows is one the server serves, and a 400 names the field. Unknown fields are ignored
(clients send extras and fields of newer API versions), except a near-miss of a field name, which is
a 400 with "did you mean" (``validation.py``). Rules that span fields are in each schema as JSON
Schema ``if``/``then`` and checked by ``check()``; "min_tokens <= max_tokens" and "prompt +
completion fit the context" cannot be written in JSON Schema, so the field descriptions say them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
)

from infer_core.sampling_params import SamplingParams, StructuredOutputs
from infer_core.server.errors import bad_request
from infer_core.server.request_types import (
    Count,
    Int,
    NonEmptyStr,
    NonNegative,
    NumChoices,
    NumLogprobs,
    RequestModel,
    TokenId,
    TokenIds,
    TopK,
    conditional,
)
from infer_core.server.structured import ONE_GRAMMAR, StructuredFields
from infer_core.server.tools import TOOL_RULES, ToolFields

PRIORITY_MARK = "x-priority"  # openapi.py: 0 only, unless the server runs the priority scheduler
TOKEN_KEYS_MARK = "x-token-id-keys"  # openapi.py: the object's keys are token ids of the loaded vocabulary
Bias = Annotated[float, Field(ge=-100, le=100)]
Priority = Annotated[Int, Field(json_schema_extra={PRIORITY_MARK: True})]
TokenKey = Annotated[StrictStr, Field(pattern=r"^(0|[1-9][0-9]{0,9})$")]  # a token id as a JSON key

class StreamOptions(RequestModel):
    include_usage: StrictBool | None = Field(None, description="end the stream with a chunk holding `usage`")


class TextPart(RequestModel):
    type: Literal["text"]
    text: StrictStr

    @field_validator("type", mode="before")
    @classmethod
    def _only_text(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "text":
            raise ValueError(f"content parts of type {value!r} are not supported (the model reads text); "
                             f"send text parts")
        return value


class ToolCallFunction(RequestModel):
    name: StrictStr
    arguments: StrictStr = Field(description="the arguments as a JSON string")


class ToolCall(RequestModel):
    id: StrictStr
    type: Literal["function"]
    function: ToolCallFunction


class ChatMessage(BaseModel):
    """One message. Other keys (``reasoning_content``, …) reach the chat template as sent, for the templates that
    read them."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[TextPart] | None = Field(None, description="text, or a list of text parts")
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant's earlier calls, for the template")
    tool_call_id: StrictStr | None = Field(None, description="which call a tool message answers")

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it: content as text, unset fields left out."""
        return {**self.model_dump(exclude_none=True), "content": self.text()}

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


_STREAM_OPTIONS_NEED_STREAM = conditional("stream_options", {"type": "object"},
                                           {"required": ["stream"], "properties": {"stream": {"const": True}}})


class _SamplingFields(StructuredFields, RequestModel):
    """The fields chat and completions share; null (or absent) means "the model's default, else OpenAI's"."""

    model: StrictStr | None = Field(None, description="the served model's name (GET /v1/models); absent: that one")
    max_tokens: Count | None = Field(
        None, description="most tokens to generate; prompt + max_tokens must fit the model's context "
                          "(max_model_len in GET /v1/models)")
    temperature: Annotated[float, Field(ge=0)] | None = Field(None, description="0 is greedy")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: TopK | None = Field(None, description="0 or -1: off")
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: NumChoices | None = Field(None, description="completions per prompt")
    stop: NonEmptyStr | list[NonEmptyStr] | None = Field(None, description="strings that end a completion")
    stop_token_ids: list[TokenId] | None = Field(None, description="token ids that end a completion")
    seed: Int | None = Field(None, description="makes the samples reproducible (any integer, used mod 2**64)")
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    stream: StrictBool | None = Field(None, description="answer as server-sent events, one chunk per step")
    stream_options: StreamOptions | None = Field(None, description="only with stream=true")
    ignore_eos: StrictBool | None = None
    min_tokens: NonNegative | None = Field(
        None, description="tokens to generate before a stop may end the completion; at most max_tokens")
    skip_special_tokens: StrictBool | None = Field(None, description="leave special tokens out of the text (default)")
    include_stop_str_in_output: StrictBool | None = Field(None, description="keep the stop string in the text")
    priority: Priority | None = Field(
        None, description="lower runs first (vLLM's); other than 0 only under --scheduler priority")
    logit_bias: Annotated[dict[TokenKey, Bias], Field(json_schema_extra={TOKEN_KEYS_MARK: True})] | None = Field(
        None, description="token id (as a string) -> added to its logit, in [-100, 100]")
    user: StrictStr | None = Field(None, description="OpenAI's end-user id: accepted, not used by this server")

    @field_validator("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                     mode="before")
    @classmethod
    def _finite_float(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                raise ValueError(f"must be a number within a double's range, got an integer of "
                                 f"{len(str(abs(value)))} digits") from None
        return value

    @property
    def is_stream(self) -> bool:
        return bool(self.stream)

    @property
    def num_choices(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def check(self) -> None:
        super().check()
        if self.stream_options is not None and not self.is_stream:
            raise bad_request("stream_options is only allowed with stream=true", param="stream_options")

    def sampling_params(self, defaults: dict[str, Any], max_tokens: int, logprobs: int | None,
                        structured_outputs: StructuredOutputs | None = None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """SamplingParams for this body; ValueError (naming the field) on a bad value."""

        def pick(name: str, fallback: Any) -> Any:
            value = getattr(self, name)
            return value if value is not None else defaults.get(name, fallback)

        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.num_choices, temperature=float(pick("temperature", 1.0)), top_p=float(pick("top_p", 1.0)),
            top_k=int(pick("top_k", 0)), min_p=float(pick("min_p", 0.0)), seed=self.seed,
            presence_penalty=float(pick("presence_penalty", 0.0)),
            frequency_penalty=float(pick("frequency_penalty", 0.0)),
            repetition_penalty=float(pick("repetition_penalty", 1.0)), max_tokens=max_tokens,
            min_tokens=pick("min_tokens", 0), stop=stop, stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos), logprobs=logprobs,
            skip_special_tokens=True if self.skip_special_tokens is None else self.skip_special_tokens,
            include_stop_str_in_output=bool(self.include_stop_str_in_output), structured_outputs=structured_outputs,
            prompt_logprobs=prompt_logprobs,
            logit_bias={int(token): float(bias) for token, bias in self.logit_bias.items()} if self.logit_bias else None)


class ChatCompletionRequest(ToolFields, _SamplingFields):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        _STREAM_OPTIONS_NEED_STREAM, ONE_GRAMMAR, *TOOL_RULES,
        conditional("top_logprobs", {"type": "integer", "minimum": 1},
                    {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}})]})

    messages: list[ChatMessage] = Field(min_length=1, description="the conversation, formatted by the chat template")
    max_completion_tokens: Count | None = Field(
        None, description="OpenAI's newer name for max_tokens; wins over it")
    logprobs: StrictBool | None = Field(None, description="return the sampled tokens' logprobs")
    top_logprobs: NumLogprobs | None = Field(
        None, description="alternatives per token; above 0 only with logprobs=true")
    add_generation_prompt: StrictBool | None = Field(None, description="end with the assistant's header (default)")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="extra variables for the chat template (e.g. enable_thinking); keys that name the "
                          "template call's own arguments (chat_template, tools, documents, …) are left out")

    def template_kwargs(self) -> dict[str, Any]:
        """Extra template variables; a client may not swap the template or the call's own arguments."""
        return {k: v for k, v in (self.chat_template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_KWARGS}

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")

    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives besides the sampled token."""
        return (self.top_logprobs or 0) if self.logprobs else None


# apply_chat_template's own arguments: a request's chat_template_kwargs cannot set them
RESERVED_TEMPLATE_KWARGS = frozenset({
    "chat_template", "conversation", "messages", "tokenize", "add_generation_prompt", "continue_final_message",
    "tools", "documents", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})


class CompletionRequest(_SamplingFields):
    model_config = ConfigDict(json_schema_extra={"allOf": [_STREAM_OPTIONS_NEED_STREAM, ONE_GRAMMAR]})

    prompt: NonEmptyStr | TokenIds | Annotated[list[NonEmptyStr], Field(min_length=1)] | Annotated[
        list[TokenIds], Field(min_length=1)] = Field(
        description="a string, token ids, or a list of either (one choice group per prompt); token ids must be "
                    "in the model's vocabulary")
    logprobs: NumLogprobs | None = Field(
        None, description="return logprobs with this many alternatives per token")
    echo: StrictBool | None = Field(
        None, description="prefix each choice with its prompt; with logprobs, the prompt's tokens are scored too")
    prompt_logprobs: NumLogprobs | None = Field(
        None, description="vLLM's: each prompt token's logprob and this many alternatives, in the choice")
    best_of: NumChoices | None = Field(
        None, description="generate this many (at least n; n when streaming) and return the n of highest "
                          "cumulative logprob")
    max_tokens: Count | None = Field(
        16, description="most tokens to generate (16 by default, as OpenAI); prompt + max_tokens must fit the "
                        "model's context; null: up to the context")

    @property
    def num_candidates(self) -> int:
        """Completions generated per prompt: best_of, else n."""
        return self.best_of if self.best_of is not None else self.num_choices

    def check(self) -> None:
        super().check()
        best_of, n = self.num_candidates, self.num_choices
        if best_of < n:
            raise bad_request(f"best_of must be at least n, got best_of={best_of} < n={n}", param="best_of")
        if best_of > n and self.is_stream:
            raise bad_request(f"best_of={best_of} with n={n} cannot stream (the best are known only at the end): "
                              f"send best_of={n} or stream=false", param="best_of")

    def prompts(self) -> list[str | list[int]]:
        """One prompt per choice group: a string or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [list(p)]
        return list(p)


class TokenizeRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]})

    model: StrictStr | None = None
    prompt: StrictStr | None = Field(None, description="text to tokenize (or messages, not both)")
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = Field(
        None, description="a conversation to format with the chat template and tokenize")
    add_special_tokens: StrictBool | None = Field(None, description="for prompt: add BOS and the like (default)")
    add_generation_prompt: StrictBool | None = Field(None, description="for messages: end with the assistant's "
                                                                       "header (default)")

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("send exactly one of prompt and messages", param="prompt")


class DetokenizeRequest(RequestModel):
    model: StrictStr | None = None
    tokens: list[TokenId] = Field(description="token ids of the model's vocabulary")
