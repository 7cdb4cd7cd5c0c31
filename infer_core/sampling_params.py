"""SamplingParams: how one request turns logits into tokens, and when it stops."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

# Below this temperature a request is greedy: logits / temperature would overflow float32 (vLLM's cut-off).
MIN_SAMPLING_TEMPERATURE = 1e-5


def _check(ok: bool, field_name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field_name} must be {rule}, got {value!r}")


_STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True, slots=True)
class StructuredOutputs:
    """A constraint on a request's output: exactly one of these (vLLM's ``StructuredOutputsParams``).

    ``json``: a JSON schema (a dict or its JSON text), the output is a document it validates;
    ``json_object``: any JSON object; ``regex``: a regular expression the whole output matches;
    ``choice``: the output is one of these strings; ``grammar``: an EBNF grammar (``root ::= ...``).
    A schema is kept as compact JSON text, so the same schema sent again is one compiled grammar.
    """

    json: str | dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in _STRUCTURED_KINDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs must set exactly one of {', '.join(_STRUCTURED_KINDS)}; "
                             f"got {', '.join(given) or 'none'}")
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json must be a JSON schema; it is not JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"structured_outputs.json must be a JSON schema (an object), got {type(schema).__name__}")
            # keys keep their order: properties are generated in the order the schema lists them
            object.__setattr__(self, "json", json.dumps(schema, separators=(",", ":")))
        if self.choice is not None:
            choice = (self.choice,) if isinstance(self.choice, str) else tuple(self.choice)
            _check(bool(choice) and all(isinstance(c, str) and c for c in choice), "structured_outputs.choice",
                   "a non-empty list of non-empty strings", self.choice)
            object.__setattr__(self, "choice", choice)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, str) and value != ""), f"structured_outputs.{name}",
                   "a non-empty string", value)

    @property
    def kind(self) -> str:
        """Which constraint this is: one of json, json_object, regex, choice, grammar."""
        return next(name for name in _STRUCTURED_KINDS if getattr(self, name) not in (None, False))


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings; the names and ranges follow vLLM and the OpenAI API.

    ``temperature=0`` (or below ``MIN_SAMPLING_TEMPERATURE``) is greedy. ``seed`` makes a request's
    samples reproducible whatever else is in the batch. ``max_tokens=None`` means "up to the model's
    context length".
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # each prompt token's logprob (and the top-N) given the tokens before it
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputs | None = None  # the output follows this grammar
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling ([-100, 100])

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check(self.stop is None or isinstance(self.stop, (list, tuple)), "stop",
               "a string or a list of strings", self.stop)
        _check(self.stop_token_ids is None or isinstance(self.stop_token_ids, (list, tuple)), "stop_token_ids",
               "a list of token ids", self.stop_token_ids)
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputs(**self.structured_outputs)
        if self.top_k is None or self.top_k == -1:
            self.top_k = 0
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field outside its allowed range."""
        _check(_is_int(self.n) and self.n >= 1, "n", "an integer >= 1", self.n)
        _check(_finite(self.temperature) and self.temperature >= 0, "temperature", ">= 0", self.temperature)
        _check(_is_int(self.top_k) and self.top_k >= 0, "top_k", "an integer >= 0 (0 or -1 = off)", self.top_k)
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        _check(self.seed is None or _is_int(self.seed), "seed", "an integer or None", self.seed)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_finite(value) and -2 <= value <= 2, name, "in [-2, 2]", value)
        _check(
            _finite(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty", "> 0", self.repetition_penalty,
        )
        _check(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
            "max_tokens", "an integer >= 1 or None", self.max_tokens,
        )
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "an integer >= 0", self.min_tokens)
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "a list of non-empty strings", self.stop)
        _check(
            all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids", "a list of token ids >= 0", self.stop_token_ids,
        )
        _check(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
            "logprobs", "an integer in [0, 20] or None", self.logprobs,
        )
        _check(
            self.prompt_logprobs is None or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= 20),
            "prompt_logprobs", "an integer in [0, 20] or None", self.prompt_logprobs,
        )
        _check(self.logit_bias is None or (isinstance(self.logit_bias, dict) and all(
            _is_int(t) and t >= 0 and _finite(b) and -100 <= b <= 100 for t, b in self.logit_bias.items())),
            "logit_bias", "a dict of token id (>= 0) -> bias in [-100, 100]", self.logit_bias)
        _check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputs),
               "structured_outputs", "a StructuredOutputs (or a dict of its fields)", self.structured_outputs)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < MIN_SAMPLING_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def for_child(self, index: int) -> SamplingParams:
        """Params of the index-th of n completions: n=1, and a distinct seed so they differ."""
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed)


def _is_int(x: object) -> bool:
    """An int that is not a bool: ``logprobs=True`` (the OpenAI chat flag) is not a count of 1."""
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
