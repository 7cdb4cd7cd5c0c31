"""Grammar backends: structured outputs as a per-request mask over the vocabulary.

A ``GrammarBackend`` compiles a ``StructuredOutputs`` spec, once per distinct spec, into a
``Constraint`` for the model's tokenizer (on the engine's side, where the tokenizer is). The
constraint travels with the request to the runner (``NewRequestData.constraint``), which gives each
request its own ``ConstraintMatcher``: before a row samples, the matcher writes the tokens the grammar
allows next into that row of a token bitmask, and after it samples, it accepts the token.

The bitmask is int32 ``[rows, ceil(vocab_size / 32)]``: token ``t`` is allowed when bit ``t % 32`` of
word ``t // 32`` is set (xgrammar's and llguidance's layout). The sampler sets every other logit of
the row to -inf on the device, in one launch for the batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from infer_core.interfaces.context import RuntimeComponent, RuntimeContext
from infer_core.sampling_params import StructuredOutputs


class ConstraintMatcher(ABC):
    """One request's position in its grammar."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by a sampled token; False (the matcher unchanged) when the grammar does not allow it."""

    @abstractmethod
    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        """Write the tokens allowed next into row ``row`` of ``bitmask`` (an int32 CPU tensor [R, W])."""

    @property
    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar has ended (a stop token was accepted): nothing more is allowed."""


class Constraint(ABC):
    """A compiled grammar for one tokenizer; shared by every request with the same spec."""

    @abstractmethod
    def matcher(self) -> ConstraintMatcher:
        """A fresh matcher at the grammar's start."""


class GrammarBackend(RuntimeComponent, ABC):
    """Compiles ``StructuredOutputs`` into ``Constraint``s for one tokenizer.

    Built by the engine the first time a request asks for structured output, with the model's
    tokenizer, the number of logit columns (the LM head's rows, which may exceed the tokenizer's
    vocabulary) and the tokens that end a request.
    """

    def __init__(self, ctx: RuntimeContext, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        super().__init__(ctx)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)

    @abstractmethod
    def compile(self, spec: StructuredOutputs) -> Constraint:
        """The constraint for ``spec``; ValueError, saying what is wrong with the spec, when it cannot be compiled."""
