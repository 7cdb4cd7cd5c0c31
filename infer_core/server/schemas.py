"""Request bodies of the OpenAI-compatible API, as pydantic models.

Unknown fields are ignored (clients send ``user``, ``tools``, vendor extras); known fields are
type-checked here and range-checked by ``SamplingParams``, so each 400 names the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from infer_core.sampling_params import SamplingParams

Number = float | int


def _number(name: str, value: float | int) -> float:
    """A float field's value; an integer too large for a float is the client's error, named."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number, got an integer of {len(str(value))} digits") from None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: StrictBool | None = None


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One message; fields besides these (``tool_calls``, ``tool_call_id``) reach the chat template as sent."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it: content as text, unset fields left out."""
        return {**self.model_dump(exclude_none=True), "content": self.text()}

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        pieces = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError(f"content parts of type {part.type!r} are not supported; send text parts")
            pieces.append(part.text)
        return "".join(pieces)


class _SamplingFields(_Body):
    """The fields chat and completions share; None (or absent) means "the model's default, else OpenAI's"."""

    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    n: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    seed: StrictInt | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool | None = None
    min_tokens: StrictInt | None = None
    skip_special_tokens: StrictBool | None = None
    user: Any = None  # accepted and ignored, as vLLM

    @field_validator("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number, not a boolean")
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

    def sampling_params(self, defaults: dict[str, Any], max_tokens: int, logprobs: int | None) -> SamplingParams:
        """SamplingParams for this body; ValueError (naming the field) on a bad value."""

        def pick(name: str, fallback: Any) -> Any:
            value = getattr(self, name)
            return value if value is not None else defaults.get(name, fallback)

        def number(name: str, fallback: float) -> float:
            return _number(name, pick(name, fallback))

        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.num_choices, temperature=number("temperature", 1.0), top_p=number("top_p", 1.0),
            top_k=int(pick("top_k", 0)), min_p=number("min_p", 0.0), seed=self.seed,
            presence_penalty=number("presence_penalty", 0.0), frequency_penalty=number("frequency_penalty", 0.0),
            repetition_penalty=number("repetition_penalty", 1.0), max_tokens=max_tokens,
            min_tokens=pick("min_tokens", 0), stop=stop, stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos), logprobs=logprobs,
            skip_special_tokens=True if self.skip_special_tokens is None else self.skip_special_tokens)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def template_kwargs(self) -> dict[str, Any]:
        """Extra template variables; a client may not swap the template or the call's own arguments."""
        reserved = {"chat_template", "conversation", "tokenize", "add_generation_prompt", "tools", "documents"}
        return {k: v for k, v in (self.chat_template_kwargs or {}).items() if k not in reserved}

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives besides the sampled token."""
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be an integer in [0, 20], got {self.top_logprobs}")
        if not self.logprobs:
            if self.top_logprobs:
                raise ValueError("top_logprobs needs logprobs=true")
            return None
        return self.top_logprobs or 0


Prompt = str | list[StrictInt] | list[str] | list[list[StrictInt]]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    logprobs: StrictInt | None = None
    echo: StrictBool | None = None
    max_tokens: StrictInt | None = 16  # the completions API's default, as OpenAI

    def prompts(self) -> list[str | list[int]]:
        """One prompt per choice group: a string, token ids, or a list of either."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt is empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[StrictInt]
