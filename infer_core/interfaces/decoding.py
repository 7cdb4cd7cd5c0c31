"""Decoding policies: how many tokens a request proposes per step and which are accepted."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from infer_core.interfaces.context import RuntimeComponent
from infer_core.interfaces.request import Request
from infer_core.interfaces.scheduling import RunnerOutput, SchedulerOutput


class DecodingPolicy(RuntimeComponent, ABC):
    """``standard`` samples one token per step; a speculative policy drafts k and verifies k+1."""

    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens a decode step may carry (KV slots the scheduler must reserve for them)."""
        return 0

    def propose(self, requests: Sequence[Request]) -> dict[str, list[int]]:
        """Draft tokens per running request for the next step (none by default)."""
        return {}

    @abstractmethod
    def accept(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> dict[str, list[int]]:
        """The tokens each request keeps from this step."""
