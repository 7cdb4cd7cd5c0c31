"""Schedulers, and the messages of one step: what to run, and what came out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from infer_core.interfaces.constraints import Constraint
from infer_core.interfaces.kv import KVAllocator
from infer_core.interfaces.request import Request, RequestStatus
from infer_core.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_lookahead_tokens: int = 0  # extra KV slots a decode step needs (speculative tokens)


@dataclass(slots=True)
class NewRequestData:
    """A request the runner has not seen (or must rebuild after preemption): everything about it."""

    request_id: str
    token_ids: list[int]  # prompt followed by the outputs generated so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    constraint: Constraint | None = None  # ``Request.constraint``: the runner gives the request a matcher of it


@dataclass(slots=True)
class CachedRequestData:
    """A request the runner already holds: only what changed since its last step."""

    request_id: str
    new_token_ids: list[int]
    new_block_ids: list[int]
    num_computed_tokens: int  # before this step, counting steps still in flight
    # Tokens after ``new_token_ids`` that the previous step sampled and nobody has read yet: the
    # runner takes them from that step's sampled ids on the device (overlapped scheduling).
    num_pending_tokens: int = 0


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan: which requests run and how many of their tokens.

    Small and picklable: it is the one message the engine sends to every worker per step.
    """

    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    finished_request_ids: set[str] = field(default_factory=set)  # runner may drop their state

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities around one sampled token (from the model's raw distribution)."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass(slots=True)
class RunnerOutput:
    """What the model produced for one step, per scheduled request, in ``request_ids`` order.

    A request mid-way through its prompt samples nothing: its list is empty.
    """

    request_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[TokenLogprobs] | None] = field(default_factory=list)
    logits: list[Any] | None = None  # per request, float32 CPU [num_sampled, vocab]; only when asked for
    # Steps that verify drafts (``SchedulerOutput.spec_token_ids``): per request, one float per sampled
    # position, the target's probability of the draft token that position verifies, after every sampling
    # transform (penalties, banned tokens, temperature, top-k/top-p, min-p; a greedy row's is 1 or 0), 0 where
    # it verifies none. There a sampled token is drawn from the residual (that distribution without the
    # draft token), the last one from the target's own. None: no draft verified, or not reported.
    draft_probs: list[list[float]] | None = None
    # SamplingParams.prompt_logprobs: request id -> (index of the first prompt token scored this step, the
    # logprobs of it and the tokens after it); only requests that asked and computed prompt positions
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] | None = None


class PendingOutput(ABC):
    """A step's RunnerOutput that the device may still be computing: launched now, read later."""

    @abstractmethod
    def result(self) -> RunnerOutput:
        """Wait for the step and return its output (the first call waits; later ones return it again)."""


@dataclass(slots=True)
class ReadyOutput(PendingOutput):
    """An output that is already on the host."""

    output: RunnerOutput

    def result(self) -> RunnerOutput:
        return self.output


@dataclass(slots=True)
class RequestUpdate:
    """A request's progress in one step, as the scheduler returns it to the engine."""

    request: Request
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None
    finished: bool


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_usage: float
    prefix_queried_tokens: int
    prefix_hit_tokens: int


class Scheduler(ABC):
    """Decides, each step, which requests run and how many tokens each computes.

    ``supports_overlap``: ``schedule`` may be called again before ``update`` has seen the previous
    step's result (the engine then plans step N+1 while step N runs on the GPU). Such a scheduler
    counts the in-flight step's tokens (``Request.num_inflight_tokens``/``num_pending_tokens``) and
    sends ``CachedRequestData.num_pending_tokens``.
    """

    supports_overlap: bool = False

    def __init__(self, config: SchedulerConfig, kv_allocator: KVAllocator) -> None:
        self.config = config
        self.kv_allocator = kv_allocator

    @abstractmethod
    def add(self, request: Request) -> None:
        """Queue a request; raise RequestError when it could never be served."""

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Plan the next step within the token budget; may preempt to make room."""

    @abstractmethod
    def update(
        self, output: SchedulerOutput, runner_output: RunnerOutput, accepted: dict[str, list[int]]
    ) -> list[RequestUpdate]:
        """Advance requests by the step's result; free the blocks of the finished ones."""

    @abstractmethod
    def finish(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, stop string); return those that were still live."""

    @abstractmethod
    def get(self, request_id: str) -> Request | None:
        """A live request by id."""

    @abstractmethod
    def stats(self) -> SchedulerStats:
        """Counters for logs and metrics."""

    @property
    @abstractmethod
    def num_unfinished(self) -> int:
        """Requests waiting or running."""
