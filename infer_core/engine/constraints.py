"""The engine's side of structured outputs: a request's spec compiled into the constraint it carries.

The grammar backend (``INFER_GRAMMAR``) is built the first time a request asks for structured
output, with the engine's tokenizer: an engine that never sees one never imports it. Compiling
runs in ``add_request`` (a spec the backend has compiled before comes from its cache); the runner
gives each request its own matcher of the constraint (runner/constraints.py).
"""

from __future__ import annotations

from typing import Any

from infer_core.errors import RequestError
from infer_core.interfaces import Constraint, GrammarBackend
from infer_core.loader import EngineSpec
from infer_core.sampling_params import StructuredOutputs


class ConstraintCompiler:
    """Specs to constraints for one engine; the backend is built on first use."""

    def __init__(self, spec: EngineSpec, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self._spec = spec
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._backend: GrammarBackend | None = None

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
        try:
            return self.backend().compile(spec)
        except ValueError as e:
            raise RequestError(str(e), param="structured_outputs") from None
