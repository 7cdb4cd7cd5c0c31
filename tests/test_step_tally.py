"""The engine core's step timeline: counted by the core loop, served by /metrics, read back by ``infer bench serve``
(the end-to-end run is in test_bench_serve_offline and tests/server/test_load)."""

from __future__ import annotations

import pytest

from infer_core.bench.core_timeline import core_timeline, format_core_timeline, offline_timeline, parse_core_totals
from infer_core.bench.timeline import StepTimeline
from infer_core.engine.engine_state import EngineSnapshot
from infer_core.engine.step_tally import StepTally, StepTotals
from infer_core.interfaces import SchedulerOutput
from infer_core.server.metrics import ServerMetrics


def _plan(tokens: list[int]) -> SchedulerOutput:
    return SchedulerOutput(num_scheduled_tokens={f"r{i}": n for i, n in enumerate(tokens)})


def test_steps_are_counted_by_kind_and_a_busy_period_ends_at_an_idle_wait():
    tally = StepTally()
    tally.stepped(_plan([100, 1]), 10.0, 10.5)  # a prompt chunk beside a decode: prefill
    tally.sent(10.5, 10.6)
    tally.stepped(_plan([1, 1]), 10.7, 10.8)  # the gap since the last send (commands, polls) is busy time
    tally.sent(10.8, 10.85)
    tally.stepped(SchedulerOutput(), 10.85, 10.95)  # launches nothing, reads the last decode: its kind's time
    tally.sent(10.95, 11.0)
    tally.idle()
    tally.stepped(_plan([1]), 20.0, 20.1)  # after an idle wait: the wait is not busy time
    assert tally.totals() == StepTotals(prefill_steps=1, prefill_tokens=101, prefill_seconds=pytest.approx(0.5),
                                        decode_steps=2, decode_tokens=3, decode_seconds=pytest.approx(0.3),
                                        send_seconds=pytest.approx(0.2), busy_seconds=pytest.approx(1.1))


def _exposition(totals: StepTotals) -> str:
    return ServerMetrics("m", lambda: EngineSnapshot(core_steps=totals)).render().decode()


def test_metrics_serve_the_totals_and_the_bench_reads_a_load_points_share_of_them():
    before = parse_core_totals(_exposition(StepTotals(1, 100, 0.5, 2, 3, 0.3, 0.2, 1.1)))
    after = parse_core_totals(_exposition(StepTotals(3, 900, 1.5, 12, 2403, 1.3, 0.4, 3.6)))
    timeline = core_timeline(before, after, window_s=4.0)
    assert timeline["prefill"] == {"steps": 2, "tokens": 800, "seconds": 1.0, "tokens_per_step": 400.0,
                                   "ms_per_step": 500.0}
    assert timeline["decode"] == {"steps": 10, "tokens": 2400, "seconds": 1.0, "tokens_per_step": 240.0,
                                  "ms_per_step": 100.0}
    assert (timeline["busy_s"], timeline["idle_s"], timeline["send_s"]) == (2.5, 1.5, 0.2)
    lines = format_core_timeline(timeline)
    assert "prefill 2 x 400.0 tok, 500.00 ms | decode 10 x 240.0 tok, 100.00 ms" in lines[0]
    assert "busy 2.500 s of 4.000 (idle 1.500 s); in steps 2.000 s, sending outputs 0.200 s" in lines[1]


def test_a_server_without_the_series_gives_no_timeline():
    assert parse_core_totals('vllm:num_requests_running{model_name="m"} 0.0\n') is None
    assert core_timeline(None, None, 1.0) is None


def test_the_offline_row_counts_its_scheduler_steps_the_same_way():
    timeline = StepTimeline(starts=[0.0, 0.4, 0.5, 0.6], num_reqs=[2, 2, 2, 1], num_tokens=[60, 2, 2, 1])
    by_kind = timeline.by_kind(end=0.8)
    assert by_kind["prefill"] == (1, 60, 0.4) and by_kind["decode"][:2] == (3, 5)
    row = offline_timeline(by_kind, duration_s=0.8)
    assert row["decode"]["ms_per_step"] == pytest.approx(400 / 3, abs=1e-3)
    assert row["busy_s"] == 0.8 and row["idle_s"] == 0.0 and row["send_s"] is None
    assert "sending" not in format_core_timeline(row)[1]
