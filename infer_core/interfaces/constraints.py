"""Grammar backends: structured outputs as a per-request mask over the vocabulary.

A ``GrammarBackend`` compiles a ``StructuredOutputs`` spec, once per distinct spec, into a
``Constraint`` for the model's tokenizer (on the engine's side, where the tokenizer is). The
constraint travels with the request to the runner (``NewRequestData.constraint``), which gives each
request its own ``ConstraintMatcher``: before a row samples, the matcher writes the tokens the grammar
allows next into that row of a token bitmask, and after it samples, it accepts the token. The runner does
both for all of a step's matchers of one class in one call (``accept_each``, ``fill_bitmasks``), which a
backend overrides to work on many matchers at once (xgrammar: its batch matcher); the defaults
take one matcher at a time.

The bitmask is int32 ``[rows, ceil(vocab_size / 32)]``: token ``t`` is allowed when bit ``t % 32`` of
word ``t // 32`` is set (xgrammar's and llguidance's layout). The sampler sets every other logit of
the row to -inf on the device, in one launch for the batch. A matcher's ``vocab_size`` may be below the
logits' (an LM head padded past its tokenizer): the bitmask is then that much narrower, and every id
past its words is never allowed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from infer_core.interfaces.context import RuntimeComponent, RuntimeContext
from infer_core.sampling_params import StructuredOutputs


class ConstraintMatcher(ABC):
    """One request's position in its grammar."""

    vocab_size: int | None = None  # the ids its bitmask rows cover, from 0 (None: every logit column)

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by a sampled token; False (the matcher unchanged) when the grammar does not allow it."""

    @abstractmethod
    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        """Write the tokens allowed next into row ``row`` of ``bitmask`` (an int32 CPU tensor [R, W], W the words
        of ``vocab_size`` ids; that row all ones before the call)."""

    @property
    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar has ended (a stop token was accepted): nothing more is allowed."""

    @classmethod
    def accept_each(cls, matchers: Sequence[ConstraintMatcher], token_ids: Sequence[int]) -> list[bool]:
        """``accept`` of each of ``matchers`` (all of this class, none terminated) with its token, in order;
        what each returned. One matcher at a time here."""
        return [matcher.accept(token_id) for matcher, token_id in zip(matchers, token_ids)]

    @classmethod
    def fill_bitmasks(cls, matchers: Sequence[ConstraintMatcher], bitmask: Any, rows: Sequence[int]) -> None:
        """Each of ``matchers`` (all of this class, none terminated) writes the tokens allowed next into its row
        (``rows``, in order) of ``bitmask``, every word of that row: the runner reuses its buffers across steps.
        Here each row is set to all ones, then ``fill_bitmask`` writes it, one matcher at a time."""
        for matcher, row in zip(matchers, rows):
            bitmask[row].fill_(-1)
            matcher.fill_bitmask(bitmask, row)


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
