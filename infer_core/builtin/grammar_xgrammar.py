"""The ``xgrammar`` grammar backend: structured outputs compiled by xgrammar (as vLLM and SGLang use).

xgrammar is imported when the first constrained request arrives, not at engine start. Compiled
grammars are cached by spec (here, bounded, and in xgrammar's own compiler): a schema compiles
once however many requests use it. JSON is generated compact (no free whitespace between tokens),
so a model cannot fill its budget with blanks. A constraint pickles (tensor-parallel ranks receive
it with the request) as xgrammar's serialized grammar and tokenizer; each process rebuilds the
tokenizer once.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from collections import OrderedDict
from typing import Any

from infer_core.interfaces import Constraint, ConstraintMatcher, GrammarBackend, RuntimeContext
from infer_core.sampling_params import StructuredOutputs

CACHE_SIZE = 256  # compiled grammars kept by spec


class XGrammarMatcher(ConstraintMatcher):
    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


class XGrammarConstraint(Constraint):
    def __init__(self, compiled: Any, stop_token_ids: tuple[int, ...]) -> None:
        self.compiled = compiled
        self.stop_token_ids = stop_token_ids

    def matcher(self) -> ConstraintMatcher:
        import xgrammar as xgr

        return XGrammarMatcher(xgr.GrammarMatcher(self.compiled, override_stop_tokens=list(self.stop_token_ids)))

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

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
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

