"""SamplingParams: how one request turns logits into tokens, and when it stops."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

# Below this temperature a request is greedy: logits / temperature would overflow float32 (vLLM's cut-off).
MIN_SAMPLING_TEMPERATURE = 1e-5


def _check(ok: bool, field_name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field_name} must be {rule}, got {value!r}")


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
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check(self.stop is None or isinstance(self.stop, (list, tuple)), "stop",
               "a string or a list of strings", self.stop)
        _check(self.stop_token_ids is None or isinstance(self.stop_token_ids, (list, tuple)), "stop_token_ids",
               "a list of token ids", self.stop_token_ids)
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
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
