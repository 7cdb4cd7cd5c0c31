"""What the engine thread tells the server: its lifecycle state and a snapshot of its counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from infer_core.interfaces import SpecDecodingStats


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"  # finishing running requests; new ones are refused
    DEAD = "dead"  # failed to load, or a step failed: every request is refused
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What the engine thread last published: read by /metrics and admission without a lock."""

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
