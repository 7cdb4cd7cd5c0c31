"""What the server knows of the engine core: its lifecycle state and a snapshot of its counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from infer_core.engine.step_tally import StepTotals
from infer_core.interfaces import SpecDecodingStats


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"  # finishing running requests; new ones are refused
    DEAD = "dead"  # failed to load, or a step failed: every request is refused
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The counters the engine core sent last (and the frontend's finished completions), read by /metrics and admission."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    spec_decoding: SpecDecodingStats | None = None  # None: the decoding policy drafts nothing
    core_steps: StepTotals = StepTotals()  # the engine-core loop's step timeline (engine/step_tally.py)


def unavailable_reason(state: EngineState, error: str | None) -> str:
    """Why a request cannot be taken in ``state`` (the 503's message)."""
    if state is EngineState.LOADING:
        return "the model is still loading; retry shortly"
    if state is EngineState.DRAINING:
        return "the server is shutting down and accepts no new requests"
    if state is EngineState.DEAD:
        return f"the engine stopped after an error and must be restarted: {error}"
    return "the engine is stopped"
