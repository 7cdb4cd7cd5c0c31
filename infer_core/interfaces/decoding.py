"""Decoding policies: how many tokens a request proposes per step and which are accepted."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from typing import TYPE_CHECKING

from infer_core.interfaces.context import RuntimeComponent
from infer_core.interfaces.request import Request
from infer_core.interfaces.scheduling import RunnerOutput, SchedulerOutput


@dataclass(frozen=True, slots=True)
class SpecDecodingStats:
    """Totals of a speculative policy since start (vLLM's ``spec_decode_*`` counters)."""

    num_drafts: int  # verify steps of one request that carried drafts
    num_draft_tokens: int  # draft tokens verified
    num_accepted_tokens: int  # draft tokens kept
    accepted_per_position: tuple[int, ...]  # [j]: drafts whose token j was kept

    @property
    def acceptance_rate(self) -> float:
        """Share of verified draft tokens kept (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a drafted request gains per verify step: the kept drafts plus the target's own token."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


if TYPE_CHECKING:
    from infer_core.interfaces.parallel import Executor
    from infer_core.settings import EngineSettings


@dataclass(frozen=True, slots=True)
class DraftRequest:
    """One request a draft model proposes for: its tokens (prompt and output, the newest last, not yet
    computed by the target) and how many tokens to draft. ``num_preemptions`` tells the draft's cache
    that the request's blocks were given up since it last drafted (its draft KV is then recomputed)."""

    request_id: str
    token_ids: list[int]
    num_tokens: int  # drafts wanted, >= 1
    num_preemptions: int = 0


class DecodingPolicy(RuntimeComponent, ABC):
    """``standard`` samples one token per step; a speculative policy drafts k and verifies k+1."""

    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens a decode step may carry (KV slots the scheduler must reserve for them)."""
        return 0

    @classmethod
    def draft_model(cls, settings: EngineSettings) -> str | None:
        """The folder of a draft model every rank's runner loads beside the target (its KV cache in the
        target's blocks, counted in the memory profile), or None. A policy with one drafts through
        ``executor.collective_rpc("propose_drafts", [DraftRequest, ...])``, which answers, per rank,
        {request_id: draft tokens} (the draft's greedy tokens: a point-mass draft distribution)."""
        return None

    def bind(self, executor: Executor) -> None:
        """Called once the ranks are started and their KV caches allocated, before the first step."""

    def propose(self, requests: Sequence[Request]) -> dict[str, list[int]]:
        """Draft tokens per running request for the next step (none by default). Under overlapped
        scheduling a request's ``num_pending_tokens`` tokens of the step in flight are not known yet
        (as if every draft of that step were kept); the drafts follow the last of them."""
        return {}

    def overlaps(self, requests: Sequence[Request]) -> bool:
        """Whether the next step may be planned while the one before it runs, with these requests
        running (a speculative policy: only where its drafts can follow tokens not yet known and a verify
        step's kept length can be counted on the device, greedily; see runner/accepted_drafts.py). A
        policy without drafts always may."""
        return not self.num_speculative_tokens

    @abstractmethod
    def accept(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> dict[str, list[int]]:
        """The tokens each request keeps from this step.

        A request that verified drafts (``scheduler_output.spec_token_ids``) has one sampled token per
        draft token plus one, and ``runner_output.draft_probs`` gives the target's probability of each
        draft token after every sampling transform (see ``RunnerOutput``)."""

    def stats(self) -> SpecDecodingStats | None:
        """Draft and acceptance counters for metrics and benchmarks (None: the policy drafts nothing)."""
        return None
