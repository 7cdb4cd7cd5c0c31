"""The core's relay of the parallel strategy's /metrics series: a copy only when due and changed, read whole
at the pipe's other end."""

from __future__ import annotations

import multiprocessing
import time

from infer_core.engine.outbox import Outbox
from infer_core.engine.parallel_metrics_relay import ParallelMetricsCopy, ParallelMetricsRelay
from infer_core.interfaces import ParallelMetric


class CountingExecutor:
    """Stands in for an executor's ``metrics()``: a counter series the test sets."""

    def __init__(self) -> None:
        self.values: tuple[tuple[str, float], ...] = ()
        self.calls = 0

    def metrics(self) -> list[ParallelMetric]:
        self.calls += 1
        if not self.values:
            return []
        return [ParallelMetric("ep_expert_tokens", "tokens routed to each expert", "counter", "expert", self.values)]


def _received(conn) -> list:
    copies = []
    while conn.poll(0.2):
        copies.append(conn.recv())
    return copies


def test_a_copy_is_sent_when_due_and_changed_and_only_then():
    ours, theirs = multiprocessing.Pipe(duplex=True)
    outbox = Outbox(ours, "test-outbox")
    executor = CountingExecutor()
    relay = ParallelMetricsRelay(executor, outbox, interval_s=0.3)
    try:
        relay.poll()  # due, nothing counted yet: the server already starts with no series
        executor.values = (("0", 5.0), ("1", 3.0))
        relay.poll()  # not due: the executor is not asked
        assert executor.calls == 1 and _received(theirs) == []
        time.sleep(0.35)
        relay.poll()
        (copy,) = _received(theirs)
        assert isinstance(copy, ParallelMetricsCopy) and copy.metrics[0].values == (("0", 5.0), ("1", 3.0))
        time.sleep(0.35)
        relay.poll()  # due but unchanged: nothing sent
        assert executor.calls == 3 and _received(theirs) == []
        executor.values = (("0", 9.0), ("1", 3.0))
        time.sleep(0.35)
        relay.poll()
        assert [c.metrics[0].values for c in _received(theirs)] == [(("0", 9.0), ("1", 3.0))]
    finally:
        outbox.close(5)
        ours.close()
        theirs.close()
