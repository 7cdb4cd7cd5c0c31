"""The ``xgrammar`` grammar backend: structured outputs compiled by xgrammar (as vLLM and SGLang use).

xgrammar is imported when the first constrained request arrives, not at engine start. Compiled
grammars are cached by spec (here, bounded, and in xgrammar's own compiler): a schema compiles
once however many requests use it. JSON is generated compact (no free whitespace between tokens),
so a model cannot fill its budget with blanks. Only the tokenizer's ids (and the stop tokens) are the
grammar's vocabulary, not an LM head's padding past them: xgrammar takes padding ids for special tokens,
and every one of them costs time in each accept and each mask; the masks are that much narrower, and
the padding is never allowed (interfaces/constraints.py). A constraint pickles (tensor-parallel ranks receive
it with the request) as xgrammar's serialized grammar and tokenizer; each process rebuilds the
tokenizer once.

A step's matchers accept their tokens in one call and fill their rows of the bitmask in one call to
xgrammar's batch matcher, outside the GIL, on one thread of its pool (``FILL_THREADS``: a row's fill is
short, and handing rows to more threads cost more than it saved on a 16-core GPU host; the figures are in
benchmarks/results/gpu-calls-2026-11-27/).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from infer_core.interfaces import Constraint, ConstraintMatcher, GrammarBackend, RuntimeContext
from infer_core.sampling_params import StructuredOutputs

logger = logging.getLogger(__name__)

CACHE_SIZE = 256  # compiled grammars kept by spec
FILL_THREADS = 1


_FILL_LOCK = threading.Lock()  # one batched fill at a time: a batch matcher's pool takes one caller at a time


@functools.lru_cache(maxsize=2)
def batch_matcher(threads: int) -> Any:
    """xgrammar's batch matcher with ``threads`` threads (its pool is kept for the process)."""
    import xgrammar as xgr

    return xgr.BatchGrammarMatcher(threads)


class XGrammarMatcher(ConstraintMatcher):
    """xgrammar's matcher. It ends when it accepts a stop token (xgrammar's rule without
    ``terminate_without_stop_token``), so whether it has ended is asked of xgrammar only then and kept."""

    threads: int | None = None  # of the batched fill; None: ``FILL_THREADS``

    def __init__(self, matcher: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._terminated = False

    def _accepted(self, token_id: int) -> None:
        if token_id in self._stop_token_ids:
            self._terminated = bool(self._matcher.is_terminated())

    def accept(self, token_id: int) -> bool:
        accepted = bool(self._matcher.accept_token(token_id))
        if accepted:
            self._accepted(token_id)
        return accepted

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        return self._terminated

    @classmethod
    def accept_each(cls, matchers: Sequence[ConstraintMatcher], token_ids: Sequence[int]) -> list[bool]:
        import xgrammar as xgr

        token_ids = list(token_ids)
        accepted = xgr.BatchGrammarMatcher.batch_accept_token([m._matcher for m in matchers], token_ids)
        for matcher, token_id, ok in zip(matchers, token_ids, accepted):
            if ok:
                matcher._accepted(token_id)
        return accepted

    @classmethod
    def fill_bitmasks(cls, matchers: Sequence[ConstraintMatcher], bitmask: Any, rows: Sequence[int]) -> None:
        """xgrammar writes whole rows (tests/test_grammar_batch.py checks it over a buffer of garbage)."""
        handles = [m._matcher for m in matchers]
        with _FILL_LOCK:  # engines of one process may fill from several threads
            batch_matcher(cls.threads or FILL_THREADS).batch_fill_next_token_bitmask(handles, bitmask, list(rows))


class XGrammarConstraint(Constraint):
    def __init__(self, compiled: Any, stop_token_ids: tuple[int, ...]) -> None:
        self.compiled = compiled
        self.stop_token_ids = stop_token_ids
        self.vocab_size = compiled.tokenizer_info.vocab_size  # the ids its masks cover
        self._stops = frozenset(stop_token_ids)

    def matcher(self) -> ConstraintMatcher:
        import xgrammar as xgr

        return XGrammarMatcher(xgr.GrammarMatcher(self.compiled, override_stop_tokens=list(self.stop_token_ids)),
                               self.vocab_size, self._stops)

    def __reduce__(self):
        info = self.compiled.tokenizer_info.serialize_json()
        return _restore, (self.compiled.serialize_json(), info, self.stop_token_ids)


@functools.lru_cache(maxsize=4)
def _tokenizer_info(serialized: str) -> Any:
    import xgrammar as xgr

    return xgr.TokenizerInfo.deserialize_json(serialized)


def _restore(grammar: str, tokenizer_info: str, stop_token_ids: tuple[int, ...]) -> XGrammarConstraint:
    import xgrammar as xgr

    info = _tokenizer_info(tokenizer_info)
    return XGrammarConstraint(xgr.CompiledGrammar.deserialize_json(grammar, info), stop_token_ids)


def grammar_vocab_size(tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> int:
    """The ids a grammar covers: the tokenizer's and the stop tokens', at most the ``vocab_size`` logit columns."""
    return min(vocab_size, max(len(tokenizer), *(t + 1 for t in stop_token_ids)))


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF whose language is exactly ``choices`` (each a JSON-escaped string literal)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class XGrammarBackend(GrammarBackend):
    """Always chosen at start, installed or not (an engine serves free text without it); a request for
    structured output where xgrammar is missing is refused, saying how to install it."""

    def __init__(self, ctx: RuntimeContext, tokenizer: Any, vocab_size: int, stop_token_ids: Any) -> None:
        super().__init__(ctx, tokenizer, vocab_size, stop_token_ids)
        if importlib.util.find_spec("xgrammar") is None:
            raise ValueError("structured outputs need xgrammar, which is not installed here: pip install xgrammar")
        import xgrammar as xgr

        covered = grammar_vocab_size(tokenizer, vocab_size, self.stop_token_ids)
        if covered > len(tokenizer):
            past = sorted(t for t in self.stop_token_ids if t >= len(tokenizer))
            logger.warning("stop token ids %s lie past the tokenizer's %d ids, so grammars cover %d ids and xgrammar "
                           "takes the %d between for special tokens, which every accept and mask pays for (tens of "
                           "times slower per token); the model's config.json and its tokenizer disagree on the end "
                           "token", past, len(tokenizer), covered, covered - len(tokenizer) - len(past))
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=covered,
                                                  stop_token_ids=list(self.stop_token_ids) or None)
        self._compiler = xgr.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1))
        self._cache: OrderedDict[StructuredOutputs, XGrammarConstraint] = OrderedDict()

    def compile(self, spec: StructuredOutputs) -> Constraint:
        cached = self._cache.get(spec)
        if cached is not None:
            self._cache.move_to_end(spec)
            return cached
        try:
            compiled = self._compile(spec)
        except (RuntimeError, ValueError, TypeError) as e:
            what = {"json": "JSON schema", "regex": "regular expression", "grammar": "EBNF grammar"}.get(spec.kind,
                                                                                                        spec.kind)
            raise ValueError(f"the {what} cannot be compiled: {_first_line(e)}") from None
        constraint = XGrammarConstraint(compiled, self.stop_token_ids)
        self._cache[spec] = constraint
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return constraint

    def _compile(self, spec: StructuredOutputs) -> Any:
        compiler = self._compiler
        kind = spec.kind
        if kind == "json":
            return compiler.compile_json_schema(spec.json, any_whitespace=False, strict_mode=True)
        if kind == "json_object":  # an object (the built-in JSON grammar would allow any value), compact
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if kind == "regex":
            return compiler.compile_regex(spec.regex)
        if kind == "choice":
            return compiler.compile_grammar(choice_grammar(spec.choice))
        return compiler.compile_grammar(spec.grammar)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0] if len(text) < 400 else text[:400]

