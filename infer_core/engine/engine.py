"""Engine: the core and the frontend's processing in one process, as ``LLM`` (llm.py) drives it.

The pieces are the ones the server composes across a process boundary (engine/async_engine.py):

1. ``InputProcessor`` (engine/input_processor.py): check the parameters against the model, tokenize, resolve
   max_tokens, name the n completions.
2. ``EngineCore`` (engine/core.py): grammars compiled, scheduler -> executor -> decoding policy; each step's
   ``RequestUpdate``s and the prompt logprobs it scored.
3. ``OutputProcessor`` (engine/output_processor.py, engine/detokenizer.py) -> ``RequestOutput``s: text that
   never splits a UTF-8 character nor shows part of a stop string; a stop string found ends the
   completion in the core.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from infer_core.engine.core import EngineCore
from infer_core.engine.input_processor import InputProcessor, Prompt, completion_ids
from infer_core.engine.output_processor import OutputProcessor
from infer_core.errors import EngineDeadError, RequestError
from infer_core.interfaces import RequestStatus, SchedulerStats
from infer_core.loader import EngineSpec, assemble
from infer_core.models.tokenizer import load_tokenizer
from infer_core.outputs import RequestOutput
from infer_core.profiling import step_range
from infer_core.sampling_params import SamplingParams
from infer_core.settings import EngineSettings, load_settings

__all__ = ["Engine", "Prompt", "load_engine_tokenizer"]


def load_engine_tokenizer(spec: EngineSpec):
    """The model's tokenizer (or the one the settings name); None when the model has none."""
    settings = spec.config.settings
    return load_tokenizer(spec.config.source, settings.tokenizer, settings.chat_template)


def tokenizer_eos(tokenizer) -> tuple[int, ...]:
    """The tokenizer's end token, which ends generation as the model config's do."""
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    return () if eos is None else (eos,)


class Engine:
    """The step loop with text in and out. Not thread-safe: every call must come from one thread."""

    def __init__(self, spec: EngineSpec) -> None:
        self.tokenizer = load_engine_tokenizer(spec)
        self.core = EngineCore(spec, tokenizer_eos(self.tokenizer), self.tokenizer)
        self.inputs = InputProcessor(self.tokenizer, self.config.model.vocab_size, self.config.max_model_len)
        self.outputs = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    @classmethod
    def from_settings(cls, settings: EngineSettings | None = None, **explicit: Any) -> Engine:
        return cls(assemble(settings or load_settings(**explicit)))

    # the core's parts, as tests and benchmarks reach them
    spec = property(lambda self: self.core.spec)
    config = property(lambda self: self.core.config)
    eos_token_ids = property(lambda self: self.core.eos_token_ids)
    executor = property(lambda self: self.core.executor)
    scheduler = property(lambda self: self.core.scheduler)
    decoding = property(lambda self: self.core.decoding)
    overlap = property(lambda self: self.core.overlap)
    num_kv_blocks = property(lambda self: self.core.num_kv_blocks)
    counters = property(lambda self: self.core.counters)
    is_dead = property(lambda self: self.core.is_dead)

    # requests --------------------------------------------------------------------------------

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template: str | None = None, **template_kwargs: Any) -> str:
        """The chat as prompt text, through the model's (or the given) chat template."""
        return self.inputs.render_chat(messages, add_generation_prompt, chat_template, **template_kwargs)

    def add_request(self, request_id: str | None, prompt: Prompt, params: SamplingParams | None = None, *,
                    add_special_tokens: bool = True, arrival_time: float | None = None, priority: int = 0,
                    final_only: bool = False) -> str:
        """Tokenize and queue a request (n completions); RequestError if it can never be served.

        ``final_only``: the caller reads only each step's ``delta_token_ids`` and the finished
        output (``LLM.generate``), so no per-step copies are made and the text is decoded at the end.
        """
        self._check_alive()
        params = self.inputs.sampling_params(params)
        request_id = request_id if request_id is not None else str(next(self._ids))
        children = completion_ids(request_id, params)
        for taken in (request_id, *(cid for cid, _ in children)):
            if self.outputs.is_known(taken) or self.core.is_known(taken):
                what = "request id" if taken == request_id else f"completion id of request {request_id!r}"
                raise RequestError(f"{what} {taken!r} is already in use", param="request_id")
        text, prompt_ids = self.inputs.tokenize(prompt, add_special_tokens)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        self.core.add(self.inputs.core_requests(children, prompt_ids, params, arrival, priority))
        self.outputs.add(request_id, text, list(prompt_ids), children, arrival, final_only=final_only)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now (its KV blocks are freed at once); returns its final output."""
        self.core.finish(self.outputs.children_of(request_id), RequestStatus.FINISHED_ABORTED)
        output = self.outputs.abort(request_id)
        if output is not None:
            self._count_finished([output])
        return output

    # the step loop ---------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.outputs.parents) or self.core.has_unfinished_requests()

    def _check_alive(self) -> None:
        if self.core.is_dead:
            raise EngineDeadError("the engine stopped after an error; restart it")

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return the RequestOutputs that progressed (overlapped: those of
        the previous step, read while this one runs).

        A failure (or KeyboardInterrupt) mid-step leaves scheduler, KV cache and outputs out of
        step with each other, so the engine is then dead: further calls raise EngineDeadError.
        """
        updates = self.core.step()
        try:
            with step_range("infer.detokenize"):
                outputs, stopped = self.outputs.process(updates, self.core.take_prompt_logprobs())
                if stopped:
                    self.core.finish(stopped, RequestStatus.FINISHED_STOPPED)
            self._count_finished(outputs)
        except BaseException:
            self.core.fail()
            raise
        return outputs

    def _count_finished(self, outputs: list[RequestOutput]) -> None:
        finished = self.core.counters.finished
        for output in outputs:
            if output.finished:
                for completion in output.outputs:
                    reason = completion.finish_reason or "abort"
                    finished[reason] = finished.get(reason, 0) + 1

    def stats(self) -> SchedulerStats:
        return self.core.stats()

    def shutdown(self) -> None:
        self.core.shutdown()
