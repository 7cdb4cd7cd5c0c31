"""A request's state as the scheduler sees it: tokens, progress, and why it ended."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infer_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from infer_core.interfaces.constraints import Constraint


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI ``finish_reason`` ("stop", "length", "abort"), None while unfinished."""
        return self.value if self.is_finished else None


@dataclass(slots=True, eq=False)
class Request:
    """One sequence to generate. ``num_computed_tokens`` is moved only by the scheduler.

    ``max_tokens`` is already resolved against the context length; ``eos_token_ids`` are the
    model's end tokens (ignored when ``sampling_params.ignore_eos``).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V a finished step computed
    # Overlapped scheduling: the next step is planned while this one runs, so the scheduler also
    # counts the tokens of steps whose results have not come back yet.
    num_inflight_tokens: int = 0  # scheduled in steps still running (computed once they return)
    num_pending_tokens: int = 0  # sampled by steps still running: their ids are known only on the device
    num_synced_tokens: int = 0  # tokens the runner has been sent so far
    num_kv_slots: int = 0  # KV slots the scheduler knows the allocator holds for it (0 while it holds none)
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first scheduling (-1: not yet scheduled)
    spec_token_ids: list[int] = field(default_factory=list)
    first_scheduled_time: float | None = None
    constraint: Constraint | None = None  # the compiled grammar of sampling_params.structured_outputs
    # the prompt never changes: its length is read every step, so it is kept, not recounted
    num_prompt_tokens: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int, max_model_len: int) -> bool:
        """Append one generated token; return True when it ends the request (status set)."""
        all_token_ids = self.all_token_ids
        all_token_ids.append(token_id)
        num_tokens = len(all_token_ids)
        num_output_tokens = num_tokens - self.num_prompt_tokens
        params = self.sampling_params
        if num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in self.eos_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
                return True
            if token_id in params.stop_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
                self.stop_reason = token_id
                return True
        if num_output_tokens >= self.max_tokens or num_tokens >= max_model_len:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False
