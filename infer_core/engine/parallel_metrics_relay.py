"""The parallel strategy's ``/metrics`` series (expert parallelism's load per expert and rank) across the
core's pipe.

The executor counts in the engine-core process; ``/metrics`` is served by the server's. The core's loop
calls ``ParallelMetricsRelay.poll`` once per turn (after a step, or after an idle wait): one clock read
unless a copy is due, and a copy is sent at most once per ``interval_s`` and only when the series changed
since the last one sent. The server keeps the last ``ParallelMetricsCopy`` it received, so ``/metrics``
lags the executor's counters by at most about ``interval_s``.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from infer_core.engine.outbox import Outbox
from infer_core.interfaces import Executor, ParallelMetric

PARALLEL_METRICS_INTERVAL_S = 1.0


class ParallelMetricsCopy(NamedTuple):
    """The core's message: the executor's ``metrics()`` at one moment."""

    metrics: list[ParallelMetric]


class ParallelMetricsRelay:
    def __init__(self, executor: Executor, outbox: Outbox, interval_s: float = PARALLEL_METRICS_INTERVAL_S) -> None:
        self._executor = executor
        self._outbox = outbox
        self._interval_s = interval_s
        self._due = 0.0
        self._sent: list[ParallelMetric] = []  # the server starts with none

    def poll(self) -> None:
        """Send the executor's series if a copy is due and they changed since the last one sent."""
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self._interval_s
        metrics = self._executor.metrics()
        if metrics != self._sent:
            self._sent = metrics
            self._outbox.put(ParallelMetricsCopy(metrics))
