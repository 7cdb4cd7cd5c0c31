"""Engine: the step loop that ``LLM`` (llm.py) and the server (engine/async_engine.py) drive.

A request's path; each invariant is stated once, beside the module that keeps it:

1. ``Engine.add_request`` (here): tokenize; n child ``Request``s to the scheduler, their parent to the outputs.
2. ``scheduler.schedule`` (builtin/scheduler_fcfs.py): token budget, KV blocks (builtin/kv_paged.py),
   preemption -> ``SchedulerOutput``. Only the scheduler moves a request's ``num_computed_tokens``.
3. ``executor.execute_async`` (builtin/parallel_single.py, or a parallel plugin's): the SchedulerOutput to
   every rank's runner/worker.py -> ``ModelRunner.execute_async`` (runner/model_runner.py), which
   a. prepares: runner/state.py (the runner's copy of a request changes only by SchedulerOutputs),
      runner/inputs.py (the flat batch, decodes first; a graph's padding writes only the pad KV block);
   b. forwards: ``forward_step`` (runner/cuda_graphs.py), one dispatch: decode graph, prefill graph or eager;
   c. samples: runner/sampling_inputs.py + layers/sampler.py, or a greedy batch's argmax graph; the ids'
      copy to the host (runner/step_output.py) -> ``PendingOutput``, whose ``result()`` is a ``RunnerOutput``.
4. ``decoding.accept`` (builtin/decoding_standard.py, or a speculative plugin's): the tokens each request keeps.
5. ``scheduler.update``: appends them; at EOS, a stop token or max_tokens a request ends, its blocks freed.
6. ``outputs.process`` (engine/output_processor.py, engine/detokenizer.py) -> ``RequestOutput``s: text that
   never splits a UTF-8 character nor shows part of a stop string (one found ends the request).

Overlapped scheduling (``async_scheduling``, where executor, scheduler and decoding policy allow it):
``step`` launches step N+1 before it reads step N's tokens (one launched step stays unread between calls);
a token step N sampled is pending in N+1, its id read on the device (``ModelRunner._prepare``). A request that
stopped in step N has one more token computed in N+1, which is dropped. A failure mid-step leaves the
engine dead (``step``). While requests are in progress the garbage collector leaves the heap that
existed when they began alone (runner/gc_policy.py).
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from infer_core.engine.output_processor import OutputProcessor
from infer_core.errors import EngineDeadError, RequestError, SettingsError
from infer_core.interfaces import (
    PendingOutput,
    Request,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    SchedulerStats,
)
from infer_core.loader import EngineSpec, assemble
from infer_core.models.tokenizer import load_tokenizer
from infer_core.outputs import RequestOutput
from infer_core.profiling import step_range
from infer_core.runner.gc_policy import STEP_LOOP_GC
from infer_core.runner.worker import Worker
from infer_core.sampling_params import SamplingParams
from infer_core.settings import EngineSettings, load_settings

logger = logging.getLogger(__name__)

Prompt = str | Sequence[int]


@dataclass(slots=True)
class EngineCounters:
    """Totals since start, for logs and Prometheus."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish_reason -> completions


class Engine:
    """The step loop. Not thread-safe: every call must come from one thread (the server runs the
    engine on its own loop and talks to it through queues)."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.tokenizer = load_tokenizer(spec.config.source, spec.config.settings.tokenizer,
                                        spec.config.settings.chat_template)
        eos = set(spec.config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)  # the runner bans these too while min_tokens holds
        self.config = config = replace(spec.config, eos_token_ids=tuple(sorted(eos)))
        self.eos_token_ids = frozenset(eos)
        settings = config.settings
        strategy = spec.chosen["parallel"].load()(spec.context)
        self.executor = strategy.create_executor(config, Worker)
        try:
            num_blocks = self._size_kv_cache(self.executor.start())
            self.executor.init_kv_cache(num_blocks)
            self.num_kv_blocks = num_blocks
            self.decoding = spec.chosen["decoding"].load()(spec.context)
            allocator = spec.chosen["kv_allocator"].load()(num_blocks, config.block_size,
                                                           settings.enable_prefix_caching)
            scheduler_config = SchedulerConfig(settings.max_num_seqs, settings.max_num_batched_tokens,
                                               config.max_model_len, self.decoding.num_speculative_tokens)
            self.scheduler = spec.chosen["scheduler"].load()(scheduler_config, allocator)
        except BaseException:
            self.executor.shutdown()  # no worker outlives a failed start
            raise
        self.overlap = (settings.async_scheduling and self.executor.supports_overlap
                        and self.scheduler.supports_overlap and not self.decoding.num_speculative_tokens)
        self._in_flight: tuple[SchedulerOutput, PendingOutput] | None = None  # launched, not yet read
        self.outputs = OutputProcessor(self.tokenizer)
        self.counters = EngineCounters()
        self._ids = itertools.count()
        self.is_dead = False
        self._gc_hold: weakref.finalize | None = None  # in a busy period: the collector's set up (runner/gc_policy.py)

    @classmethod
    def from_settings(cls, settings: EngineSettings | None = None, **explicit: Any) -> Engine:
        return cls(assemble(settings or load_settings(**explicit)))

    def _size_kv_cache(self, possible: int) -> int:
        config = self.config
        settings = config.settings
        num_blocks = settings.num_kv_blocks or possible
        tokens = num_blocks * config.block_size
        logger.info("KV cache: %d blocks of %d tokens = %d tokens; max concurrent requests at max_model_len: %.2f",
                    num_blocks, config.block_size, tokens, tokens / config.max_model_len)
        if tokens < config.max_model_len:
            if settings.num_kv_blocks is None:
                raise SettingsError(
                    f"the KV cache holds {tokens} tokens, less than one request at max_model_len "
                    f"({config.max_model_len}); raise gpu_memory_utilization or kv_cache_gb, or lower max_model_len"
                )
            logger.warning("num_kv_blocks=%d holds fewer tokens (%d) than max_model_len (%d): long requests are refused",
                           num_blocks, tokens, config.max_model_len)
        return num_blocks

    # requests --------------------------------------------------------------------------------

    def _tokenize(self, prompt: Prompt, add_special_tokens: bool) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer: send the prompt as token ids", param="prompt")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.config.model.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", param="prompt")
            return None, list(prompt)
        raise RequestError("a prompt is a string or a list of token ids", param="prompt")

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template: str | None = None, **template_kwargs: Any) -> str:
        """The chat as prompt text, through the model's (or the given) chat template."""
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer, so it cannot format a chat", param="messages")
        template = chat_template or self.tokenizer.chat_template
        if not template:
            raise RequestError("the model has no chat template; pass one with --chat-template (INFER_CHAT_TEMPLATE)",
                               param="messages")
        try:
            return self.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **template_kwargs)
        except Exception as e:
            raise RequestError(f"the chat template could not format these messages: {e}", param="messages") from None

    def add_request(self, request_id: str | None, prompt: Prompt, params: SamplingParams | None = None, *,
                    add_special_tokens: bool = True, arrival_time: float | None = None, priority: int = 0,
                    final_only: bool = False) -> str:
        """Tokenize and queue a request (n completions); RequestError if it can never be served.

        ``final_only``: the caller reads only each step's ``delta_token_ids`` and the finished
        output (``LLM.generate``), so no per-step copies are made and the text is decoded at the end.
        """
        self._check_alive()
        params = params or SamplingParams()
        if params.top_k >= self.config.model.vocab_size:
            params = replace(params, top_k=0)  # keeping the whole vocabulary is no top-k at all (and fits int64)
        request_id = request_id if request_id is not None else str(next(self._ids))
        children = [(request_id if params.n == 1 else f"{i}_{request_id}", params if params.n == 1 else params.for_child(i))
                    for i in range(params.n)]
        for taken in (request_id, *(cid for cid, _ in children)):
            if self.outputs.is_known(taken) or self.scheduler.get(taken) is not None:
                what = "request id" if taken == request_id else f"completion id of request {request_id!r}"
                raise RequestError(f"{what} {taken!r} is already in use", param="request_id")
        if params.stop and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer and this model has none; use stop_token_ids",
                               param="stop")
        text, prompt_ids = self._tokenize(prompt, add_special_tokens)
        remaining = self.config.max_model_len - len(prompt_ids)
        max_tokens = min(params.max_tokens or remaining, max(remaining, 1))
        arrival = time.monotonic() if arrival_time is None else arrival_time
        requests = [Request(cid, list(prompt_ids), cparams, max_tokens, self.eos_token_ids, priority, arrival)
                    for cid, cparams in children]
        added: list[str] = []
        try:
            for request in requests:
                self.scheduler.add(request)
                added.append(request.request_id)
        except BaseException:
            self.scheduler.finish(added, RequestStatus.FINISHED_ABORTED)
            raise
        self.outputs.add(request_id, text, list(prompt_ids), children, arrival, final_only=final_only)
        self.counters.prompt_tokens += len(prompt_ids) * params.n
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now (its KV blocks are freed at once); returns its final output."""
        self.scheduler.finish(self.outputs.children_of(request_id), RequestStatus.FINISHED_ABORTED)
        output = self.outputs.abort(request_id)
        if output is not None:
            self._count_finished([output])
        if not self.has_unfinished_requests():
            self._release_gc()
        return output

    # the step loop ---------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.outputs.parents) or self.scheduler.num_unfinished > 0 or self._in_flight is not None

    def _check_alive(self) -> None:
        if self.is_dead:
            raise EngineDeadError("the engine stopped after an error; restart it")

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return the RequestOutputs that progressed (overlapped: those of
        the previous step, read while this one runs).

        A failure (or KeyboardInterrupt) mid-step leaves scheduler, KV cache and outputs out of
        step with each other, so the engine is then dead: further calls raise EngineDeadError.
        """
        self._check_alive()
        if self._gc_hold is None:  # a busy period starts: GC passes leave what exists now alone
            self._gc_hold = STEP_LOOP_GC.hold_while_alive(self)
        try:
            outputs = self._step()
        except BaseException:
            self.is_dead = True
            self._release_gc()
            raise
        if not self.has_unfinished_requests():
            self._release_gc()
        return outputs

    def _release_gc(self) -> None:
        if self._gc_hold is not None:
            self._gc_hold, hold = None, self._gc_hold
            hold()

    def _step(self) -> list[RequestOutput]:
        # The named ranges are what `infer bench --profile` splits a step's host time into.
        with step_range("infer.schedule"):
            drafted = self._propose_drafts()
            scheduler_output = self.scheduler.schedule()
            for request in drafted:
                request.spec_token_ids = []  # drafts are good for one step only
        launched = (scheduler_output, self.executor.execute_async(scheduler_output))
        previous, self._in_flight = self._in_flight, None
        if scheduler_output.is_empty and previous is None and self.scheduler.num_unfinished:
            raise RuntimeError("the scheduler made no progress with requests pending; this is a bug")
        outputs = self._finish_step(*previous) if previous is not None else []
        if self.overlap and not scheduler_output.is_empty:
            self._in_flight = launched  # read by the next call, while the step after it runs
            return outputs
        return outputs + self._finish_step(*launched)

    def _finish_step(self, scheduler_output: SchedulerOutput, pending: PendingOutput) -> list[RequestOutput]:
        """Read a launched step's tokens and advance requests, outputs and counters by them."""
        runner_output = pending.result()
        with step_range("infer.process_outputs"):
            accepted = self.decoding.accept(scheduler_output, runner_output)
            updates = self.scheduler.update(scheduler_output, runner_output, accepted)
            outputs, stopped = self.outputs.process(updates)
            if stopped:
                self.scheduler.finish(stopped, RequestStatus.FINISHED_STOPPED)
        self.counters.generation_tokens += sum(len(u.new_token_ids) for u in updates)
        self._count_finished(outputs)
        return outputs

    def _propose_drafts(self) -> list[Request]:
        """Ask a speculative policy for this step's drafts; the requests that got some."""
        if not self.decoding.num_speculative_tokens:
            return []
        live = [r for r in (self.scheduler.get(c) for c in self.outputs.parent_of) if r is not None]
        drafted = []
        for request_id, draft in self.decoding.propose(live).items():
            request = self.scheduler.get(request_id)
            if request is not None and draft:
                request.spec_token_ids = list(draft[: self.decoding.num_speculative_tokens])
                drafted.append(request)
        return drafted

    def _count_finished(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            if output.finished:
                for completion in output.outputs:
                    reason = completion.finish_reason or "abort"
                    self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def shutdown(self) -> None:
        self._release_gc()
        self.executor.shutdown()
