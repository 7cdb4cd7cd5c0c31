"""The core's relay of its slowly changing totals (the parallel strategy's /metrics series, a speculative
policy's counters): a copy only when due and changed, read whole at the pipe's other end."""

from __future__ import annotations

import multiprocessing
import time

from infer_core.engine.outbox import Outbox
from infer_core.engine.core_stats_relay import CoreStatsCopy, CoreStatsRelay, engine_snapshot, with_stats
from infer_core.engine.core_messages import CoreCounters
from infer_core.interfaces import ParallelMetric, SpecDecodingStats


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


class DraftingPolicy:
    """Stands in for a speculative decoding policy's ``stats()``."""

    def __init__(self) -> None:
        self.current: SpecDecodingStats | None = None

    def stats(self) -> SpecDecodingStats | None:
        return self.current


def _received(conn) -> list:
    copies = []
    while conn.poll(0.2):
        copies.append(conn.recv())
    return copies


def test_a_copy_is_sent_when_due_and_changed_and_only_then():
    ours, theirs = multiprocessing.Pipe(duplex=True)
    outbox = Outbox(ours, "test-outbox")
    executor, decoding = CountingExecutor(), DraftingPolicy()
    relay = CoreStatsRelay(executor, decoding, outbox, interval_s=0.3)
    try:
        relay.poll()  # due, nothing counted yet: the server already starts with no series
        executor.values = (("0", 5.0), ("1", 3.0))
        relay.poll()  # not due: the executor is not asked
        assert executor.calls == 1 and _received(theirs) == []
        time.sleep(0.35)
        relay.poll()
        (copy,) = _received(theirs)
        assert isinstance(copy, CoreStatsCopy) and copy.parallel[0].values == (("0", 5.0), ("1", 3.0))
        assert copy.spec_decoding is None
        time.sleep(0.35)
        relay.poll()  # due but unchanged: nothing sent
        assert executor.calls == 3 and _received(theirs) == []
        executor.values = (("0", 9.0), ("1", 3.0))
        time.sleep(0.35)
        relay.poll()
        assert [c.parallel[0].values for c in _received(theirs)] == [(("0", 9.0), ("1", 3.0))]
        decoding.current = SpecDecodingStats(4, 12, 5, (3, 2, 0))
        time.sleep(0.35)
        relay.poll()
        (copy,) = _received(theirs)
        assert copy.spec_decoding == decoding.current and copy.parallel[0].values == (("0", 9.0), ("1", 3.0))
    finally:
        outbox.close(5)
        ours.close()
        theirs.close()


def test_the_snapshot_takes_the_last_copy_whether_it_came_before_or_after_the_step():
    stats = CoreStatsCopy([], SpecDecodingStats(2, 6, 3, (2, 1, 0)))
    snapshot = engine_snapshot(CoreCounters(num_running=1, prompt_tokens=7, generation_tokens=3), {"length": 1}, stats)
    assert (snapshot.num_running, snapshot.prompt_tokens, snapshot.generation_tokens) == (1, 7, 3)
    assert snapshot.finished == {"length": 1} and snapshot.spec_decoding == stats.spec_decoding
    newer = CoreStatsCopy([], SpecDecodingStats(3, 9, 5, (3, 2, 0)))
    updated = with_stats(snapshot, newer)
    assert updated.spec_decoding == newer.spec_decoding and updated.prompt_tokens == 7
