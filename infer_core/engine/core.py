"""EngineCore: the step loop over requests of token ids; what runs in the engine-core process.

A request's path through the core; each invariant is stated once, beside the module that keeps it:

1. ``EngineCore.add`` (here): a request's completions, each a ``CoreRequest`` of token ids, to the scheduler;
   a structured-output spec compiled into its grammar here (engine/constraints.py, cached by spec).
2. ``scheduler.schedule`` (builtin/scheduler_fcfs.py): token budget, KV blocks (builtin/kv_paged.py),
   preemption -> ``SchedulerOutput``. Only the scheduler moves a request's ``num_computed_tokens``.
3. ``executor.execute_async`` (builtin/parallel_single.py, or a parallel plugin's): the SchedulerOutput to
   every rank's runner/worker.py -> ``ModelRunner.execute_async`` (runner/model_runner.py), which
   a. prepares: runner/state.py (the runner's copy of a request changes only by SchedulerOutputs),
      runner/inputs.py (the flat batch, decodes first; a graph's padding writes only the pad KV block);
   b. forwards: ``forward_step`` (runner/cuda_graphs.py), one dispatch: decode graph, prefill graph or eager;
   c. samples: runner/sampling_inputs.py, runner/grammar_masks.py (grammar masks), layers/sampler.py, or a greedy
      batch's argmax graph; the ids' copy to the host (runner/step_output.py) -> ``PendingOutput`` (``RunnerOutput``).
4. ``decoding.accept`` (builtin/decoding_standard.py, or a speculative plugin's): the tokens each request keeps.
5. ``scheduler.update``: appends them; at EOS, a stop token or max_tokens a request ends, its blocks freed.
   ``step`` returns these ``RequestUpdate``s (and ``take_prompt_logprobs`` the prompt tokens scored since the
   last call); text, stop strings and n completions are the frontend's
   (engine/engine.py in one process, engine/async_engine.py across the process boundary).

Overlapped scheduling (``async_scheduling``, where executor and scheduler allow it, and the decoding policy
for the requests running: ``DecodingPolicy.overlaps``): ``step`` launches step N+1 before it reads step N's
tokens (one launched step stays unread between calls); a token step N sampled is pending in N+1, its id read
on the device (``ModelRunner._prepare``), and drafts step N verified count as kept until it is read
(runner/accepted_drafts.py). A request that
stopped in step N has one more token computed in N+1, which is dropped. A failure mid-step leaves the
core dead (``step``). While requests are in progress the garbage collector leaves the heap that
existed when they began alone (runner/gc_policy.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from infer_core.engine.constraints import ConstraintCompiler
from infer_core.errors import EngineDeadError, RequestError, SettingsError
from infer_core.interfaces import (
    Constraint,
    PendingOutput,
    Request,
    RequestStatus,
    RequestUpdate,
    SchedulerConfig,
    SchedulerOutput,
    SchedulerStats,
    TokenLogprobs,
)
from infer_core.loader import EngineSpec
from infer_core.profiling import step_range
from infer_core.runner.accepted_drafts import may_plan_over_verify_steps
from infer_core.runner.gc_policy import STEP_LOOP_GC
from infer_core.runner.worker import Worker
from infer_core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# completion id -> (index of its first prompt token scored, the logprobs of that token and the ones after it)
PromptLogprobs = dict[str, tuple[int, list[TokenLogprobs]]]


def merge_prompt_logprobs(into: PromptLogprobs, scored: PromptLogprobs) -> None:
    """Add a step's scored prompt chunks to ``into``; a request's next chunk extends the one before it
    (a request preempted mid-prompt scores its recomputed positions again: those replace the ones kept)."""
    for request_id, (first, entries) in scored.items():
        kept = into.get(request_id)
        if kept is not None and kept[0] <= first <= kept[0] + len(kept[1]):
            into[request_id] = (kept[0], kept[1][: first - kept[0]] + entries)
        else:
            into[request_id] = (first, entries)


@dataclass(frozen=True, slots=True)
class CoreRequest:
    """One completion as the core takes it: token ids in, and how to sample them. Small and picklable."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # already resolved against max_model_len
    arrival_time: float  # time.monotonic(), a clock every process of the machine shares
    priority: int = 0


@dataclass(slots=True)
class EngineCounters:
    """Totals since start, for logs and Prometheus. The core counts tokens; whoever reads the
    outputs counts finished completions (a stop string ends one only there)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish_reason -> completions


class EngineCore:
    """Scheduler, executor and decoding policy. Not thread-safe: one thread makes every call."""

    def __init__(self, spec: EngineSpec, extra_eos_token_ids: Iterable[int] = (), tokenizer: Any = None) -> None:
        """``tokenizer``: the model's (structured outputs compile grammars for it; None refuses them)."""
        self.spec = spec
        eos = set(spec.config.eos_token_ids) | set(extra_eos_token_ids)  # the runner bans these while min_tokens holds
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
            self.decoding.bind(self.executor)  # a policy with a draft model proposes through the executor
            allocator = spec.chosen["kv_allocator"].load()(num_blocks, config.block_size,
                                                           settings.enable_prefix_caching)
            scheduler_config = SchedulerConfig(settings.max_num_seqs, settings.max_num_batched_tokens,
                                               config.max_model_len, self.decoding.num_speculative_tokens)
            self.scheduler = spec.chosen["scheduler"].load()(scheduler_config, allocator)
        except BaseException:
            self.executor.shutdown()  # no worker outlives a failed start
            raise
        self.overlap = bool(settings.async_scheduling and self.executor.supports_overlap
                            and self.scheduler.supports_overlap)
        attention = spec.chosen["attention"].load().capabilities(spec.context)
        self.overlaps_verify_steps = may_plan_over_verify_steps(spec.context.device, attention)
        self._in_flight: tuple[SchedulerOutput, PendingOutput] | None = None  # launched, not yet read
        self.last_plan: SchedulerOutput | None = None  # what the last ``step`` launched (the core loop's tally reads it)
        self.counters = EngineCounters()
        self.constraints = ConstraintCompiler(spec, tokenizer, config.model.vocab_size, config.eos_token_ids)
        self._prompt_logprobs: PromptLogprobs = {}  # scored since the last take_prompt_logprobs
        self._drafting_ids: dict[str, None] = {}  # with a speculative policy: the ids of requests added, in order
        self.is_dead = False
        self._gc_hold: weakref.finalize | None = None  # in a busy period: the collector's set up (runner/gc_policy.py)

    def _size_kv_cache(self, possible: int) -> int:
        config = self.config
        settings = config.settings
        num_blocks = settings.num_kv_blocks or possible
        tokens = num_blocks * config.block_size
        kv_dtype = "float8 e4m3" if settings.kv_cache_dtype == "fp8" else config.dtype
        logger.info("KV cache: %d blocks of %d tokens = %d tokens (%s); max concurrent requests at max_model_len: %.2f",
                    num_blocks, config.block_size, tokens, kv_dtype, tokens / config.max_model_len)
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

    def add(self, requests: Sequence[CoreRequest]) -> None:
        """Queue one request's completions, all or none; RequestError if one can never be served."""
        self._check_alive()
        eos = self.eos_token_ids
        constraints = [self._constraint(r) for r in requests]  # a spec compiles once: it is kept
        added: list[str] = []
        try:
            for r, constraint in zip(requests, constraints):
                self.scheduler.add(Request(r.request_id, list(r.prompt_token_ids), r.params, r.max_tokens, eos,
                                           r.priority, r.arrival_time, constraint=constraint))
                added.append(r.request_id)
        except BaseException:
            self.scheduler.finish(added, RequestStatus.FINISHED_ABORTED)
            raise
        if self.decoding.num_speculative_tokens:
            self._drafting_ids.update(dict.fromkeys(added))
        self.counters.prompt_tokens += sum(len(r.prompt_token_ids) for r in requests)

    def _constraint(self, request: CoreRequest) -> Constraint | None:
        spec = request.params.structured_outputs
        if spec is not None and self.decoding.num_speculative_tokens:
            raise RequestError(
                f"structured outputs cannot be combined with speculative decoding (decoding="
                f"{self.config.settings.decoding!r} verifies drafts without the grammar's mask); serve with "
                f"--decoding standard for structured outputs", param="structured_outputs")
        return self.constraints.compile(spec)

    def take_prompt_logprobs(self) -> PromptLogprobs:
        """The prompt logprobs (``SamplingParams.prompt_logprobs``) scored since the last call, by completion id."""
        scored, self._prompt_logprobs = self._prompt_logprobs, {}
        return scored

    def is_known(self, request_id: str) -> bool:
        return self.scheduler.get(request_id) is not None

    def finish(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """End these completions now (their KV blocks are freed at once); unknown ids are ignored."""
        self.scheduler.finish(request_ids, status)
        if not self.has_unfinished_requests():
            self._release_gc()

    # the step loop ---------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0 or self._in_flight is not None

    def _check_alive(self) -> None:
        if self.is_dead:
            raise EngineDeadError("the engine stopped after an error; restart it")

    def step(self) -> list[RequestUpdate]:
        """Run one scheduled step; return the updates of the requests that progressed (overlapped:
        those of the previous step, read while this one runs).

        A failure (or KeyboardInterrupt) mid-step leaves scheduler and KV cache out of step with
        each other, so the core is then dead: further calls raise EngineDeadError.
        """
        self._check_alive()
        if self._gc_hold is None:  # a busy period starts: GC passes leave what exists now alone
            self._gc_hold = STEP_LOOP_GC.hold_while_alive(self)
        try:
            updates = self._step()
        except BaseException:
            self.fail()
            raise
        if not self.has_unfinished_requests():
            self._release_gc()
        return updates

    def fail(self) -> None:
        """A step failed part-way (here or in whoever read its updates): refuse every later call."""
        self.is_dead = True
        self._release_gc()

    def _release_gc(self) -> None:
        if self._gc_hold is not None:
            self._gc_hold, hold = None, self._gc_hold
            hold()

    def _step(self) -> list[RequestUpdate]:
        # The named ranges are what `infer bench --profile` splits a step's host time into.
        updates: list[RequestUpdate] = []
        with step_range("infer.schedule"):
            live = self._drafting_requests()
            if self._in_flight is not None and live and not (self.overlaps_verify_steps
                                                             and self.decoding.overlaps(live)):
                previous, self._in_flight = self._in_flight, None  # drafts that need the step's tokens first
                updates = self._finish_step(*previous)
                live = self._drafting_requests()
            drafted = self._propose_drafts(live)
            scheduler_output = self.last_plan = self.scheduler.schedule()
            for request in drafted:
                request.spec_token_ids = []  # drafts are good for one step only
        launched = (scheduler_output, self.executor.execute_async(scheduler_output))
        previous, self._in_flight = self._in_flight, None
        if scheduler_output.is_empty and previous is None and not updates and self.scheduler.num_unfinished:
            raise RuntimeError("the scheduler made no progress with requests pending; this is a bug")
        if previous is not None:
            updates += self._finish_step(*previous)
        if self.overlap and not scheduler_output.is_empty:
            self._in_flight = launched  # read by the next call, while the step after it runs
            return updates
        return updates + self._finish_step(*launched)

    def _finish_step(self, scheduler_output: SchedulerOutput, pending: PendingOutput) -> list[RequestUpdate]:
        """Read a launched step's tokens and advance requests and counters by them."""
        runner_output = pending.result()
        if runner_output.prompt_logprobs:
            merge_prompt_logprobs(self._prompt_logprobs, runner_output.prompt_logprobs)
        with step_range("infer.process_outputs"):
            accepted = self.decoding.accept(scheduler_output, runner_output)
            updates = self.scheduler.update(scheduler_output, runner_output, accepted)
        self.counters.generation_tokens += sum(len(u.new_token_ids) for u in updates)
        return updates

    def _drafting_requests(self) -> list[Request]:
        """With a speculative policy, the requests it may draft for (in the order they were added)."""
        requests = {request_id: self.scheduler.get(request_id) for request_id in self._drafting_ids}  # one lookup each
        for request_id in [request_id for request_id, request in requests.items() if request is None]:
            del self._drafting_ids[request_id]  # finished
        return [request for request in requests.values() if request is not None]

    def _propose_drafts(self, live: list[Request]) -> list[Request]:
        """Ask a speculative policy for this step's drafts; the requests that got some."""
        if not live:
            return []
        drafted = []
        for request_id, draft in self.decoding.propose(live).items():
            request = self.scheduler.get(request_id)
            if request is not None and draft:
                request.spec_token_ids = list(draft[: self.decoding.num_speculative_tokens])
                drafted.append(request)
        return drafted

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def shutdown(self) -> None:
        self._release_gc()
        self.constraints.shutdown()
        self.executor.shutdown()
