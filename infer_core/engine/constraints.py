"""The engine core's side of structured outputs: a request's spec compiled into the constraint it carries.

The grammar backend (``INFER_GRAMMAR``) is built the first time a request asks for structured
output, with the model's tokenizer: an engine that never sees one never imports it. Each distinct
spec is compiled once and kept (``CACHE_SIZE`` specs, least recently used dropped), and so is the
refusal of one that does not compile. ``EngineCore.add`` takes a request's constraints from here
(compiling a spec not seen before on the spot: the in-process ``Engine``); the engine-core process
compiles new specs in a thread first (``compile_later``), so its step loop never waits for a
compilation, and adds the request once they are done. The runner gives each request its own
matcher of the constraint (runner/constraints.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from infer_core.errors import RequestError
from infer_core.interfaces import Constraint, GrammarBackend
from infer_core.loader import EngineSpec
from infer_core.sampling_params import StructuredOutputs

CACHE_SIZE = 256  # compiled specs (and refused ones) kept

Compiled = list[tuple[StructuredOutputs, "Constraint | RequestError"]]


class ConstraintCompiler:
    """Specs to constraints for one engine; the backend is built on first use."""

    def __init__(self, spec: EngineSpec, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self._spec = spec
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._backend: GrammarBackend | None = None
        self._done: OrderedDict[StructuredOutputs, Constraint | RequestError] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None

    def backend(self) -> GrammarBackend:
        """The grammar backend, built on first use; ValueError when it cannot be (no tokenizer, not installed)."""
        if self._backend is None:
            if self._tokenizer is None:
                raise ValueError("structured outputs need the model's tokenizer, and this model has none")
            chosen = self._spec.chosen["grammar"]
            self._backend = chosen.load()(self._spec.context, self._tokenizer, self._vocab_size,
                                          self._stop_token_ids)
        return self._backend

    def compile(self, spec: StructuredOutputs | None) -> Constraint | None:
        """The constraint of ``spec`` (None: unconstrained); RequestError when the spec cannot be compiled."""
        if spec is None:
            return None
        done = self._done.get(spec)
        if done is None:
            done = self._keep(spec, self._compile(spec))
        else:
            self._done.move_to_end(spec)
        if isinstance(done, RequestError):
            raise RequestError(str(done), param=done.param)
        return done

    def compile_later(self, specs: Iterable[StructuredOutputs | None]) -> Future | None:
        """None when every spec is ready (none, or compiled before); else the future of their compilation in a
        thread of its own, to be handed to ``take`` once done."""
        new = [s for s in dict.fromkeys(specs) if s is not None and s not in self._done]
        if not new:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="infer-grammar-compiler")
        return self._pool.submit(lambda: [(s, self._compile(s)) for s in new])

    def take(self, future: Future) -> None:
        """Keep what a finished ``compile_later`` compiled (on the caller's thread: the cache has one writer)."""
        for spec, done in future.result():
            self._keep(spec, done)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, spec: StructuredOutputs) -> Constraint | RequestError:
        try:
            return self.backend().compile(spec)
        except ValueError as e:
            return RequestError(str(e), param="structured_outputs")

    def _keep(self, spec: StructuredOutputs, done: Constraint | RequestError) -> Constraint | RequestError:
        self._done[spec] = done
        if len(self._done) > CACHE_SIZE:
            self._done.popitem(last=False)
        return done
