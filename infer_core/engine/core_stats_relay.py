"""The engine's slowly changing totals across the core's pipe: the parallel strategy's ``/metrics`` series
(expert parallelism's load per expert and rank) and a speculative decoding policy's counters.

They are counted in the engine-core process; ``/metrics`` is served by the server's. The core's loop calls
``CoreStatsRelay.poll`` once per turn (after a step, or after an idle wait): one clock read unless a copy is
due, and a copy is sent at most once per ``interval_s`` and only when it differs from the last one sent. The
server keeps the last ``CoreStatsCopy`` it received, so ``/metrics`` lags these totals by about
``interval_s`` at most, and a step pays for neither reading nor pickling them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

from infer_core.engine.core_messages import CoreCounters
from infer_core.engine.engine_state import EngineSnapshot
from infer_core.engine.outbox import Outbox
from infer_core.interfaces import DecodingPolicy, Executor, ParallelMetric, SpecDecodingStats

CORE_STATS_INTERVAL_S = 1.0


class CoreStatsCopy(NamedTuple):
    """The core's message: the executor's ``metrics()`` and the decoding policy's ``stats()`` at one moment."""

    parallel: list[ParallelMetric]
    spec_decoding: SpecDecodingStats | None  # None: the decoding policy drafts nothing


NO_CORE_STATS = CoreStatsCopy([], None)  # what the server starts with


class CoreStatsRelay:
    def __init__(self, executor: Executor, decoding: DecodingPolicy, outbox: Outbox,
                 interval_s: float = CORE_STATS_INTERVAL_S) -> None:
        self._executor = executor
        self._decoding = decoding
        self._outbox = outbox
        self._interval_s = interval_s
        self._due = 0.0
        self._sent = NO_CORE_STATS

    def poll(self) -> None:
        """Send a copy if one is due and it differs from the last one sent."""
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self._interval_s
        copy = CoreStatsCopy(self._executor.metrics(), self._decoding.stats())
        if copy != self._sent:
            self._sent = copy
            self._outbox.put(copy)


def engine_snapshot(c: CoreCounters, finished: dict[str, int], stats: CoreStatsCopy) -> EngineSnapshot:
    """What ``/metrics`` reads: a step's counters, the finished requests counted here, the last stats copy."""
    return EngineSnapshot(c.num_running, c.num_waiting, c.kv_usage, c.num_preemptions, c.prefix_queried_tokens,
                          c.prefix_hit_tokens, c.prompt_tokens, c.generation_tokens, dict(finished),
                          stats.spec_decoding, c.steps)


def with_stats(snapshot: EngineSnapshot, stats: CoreStatsCopy) -> EngineSnapshot:
    """``snapshot`` with a newer stats copy (one that came after the last step)."""
    return dataclasses.replace(snapshot, spec_decoding=stats.spec_decoding)
