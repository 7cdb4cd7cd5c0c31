"""From the records of one load point to its figures: throughput and latency summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infer_core.bench.load import LoadPoint, LoadRun
from infer_core.bench.stats import Summary, summarize
from infer_core.bench.stream import RequestRecord

METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(slots=True)
class LoadPointResult:
    """Figures of one load point. Latencies are in milliseconds, over completed requests only;
    ``records`` keeps every request's own measurements, in send order."""

    load: LoadPoint
    num_requests: int
    num_completed: int
    num_failed: int
    first_error: str | None
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    max_in_flight: int
    ttft_ms: Summary
    tpot_ms: Summary
    itl_ms: Summary
    e2e_ms: Summary
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    core_timeline: dict[str, Any] | None = None  # the engine core's steps in this load point (bench/core_timeline.py)

    @property
    def request_throughput(self) -> float:
        """Completed requests per second of the measured phase."""
        return self.num_completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def output_tok_s(self) -> float:
        """Output tokens of completed requests per second of the measured phase."""
        return (
            self.total_output_tokens / self.duration_s if self.duration_s > 0 else 0.0
        )

    @property
    def input_tok_s(self) -> float:
        return self.total_input_tokens / self.duration_s if self.duration_s > 0 else 0.0

    def as_row(self, system: str) -> dict[str, Any]:
        """A flat ``results`` row; the same keys for every system measured."""
        rate = self.load.request_rate
        row: dict[str, Any] = {
            "system": system,
            "concurrency": self.load.concurrency,
            "request_rate": rate if math.isfinite(rate) else "inf",
            "num_requests": self.num_requests,
            "completed": self.num_completed,
            "failed": self.num_failed,
            "first_error": self.first_error,
            "duration_s": self.duration_s,
            "request_throughput": self.request_throughput,
            "output_tok_s": self.output_tok_s,
            "input_tok_s": self.input_tok_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "max_in_flight": self.max_in_flight,
        }
        for metric in METRICS:
            summary: Summary = getattr(self, f"{metric}_ms")
            for stat in ("mean", "p50", "p90", "p99"):
                row[f"{stat}_{metric}_ms"] = getattr(summary, stat)
        if self.core_timeline is not None:
            row["core_timeline"] = self.core_timeline
        return row


def summarize_run(
    load: LoadPoint, run: LoadRun, prompts: Sequence[Any]
) -> LoadPointResult:
    """Totals and latency summaries of one load point; a prompt's length counts when usage lacks it."""
    completed = [r for r in run.records if r.is_ok]
    failed = [r for r in run.records if not r.is_ok]
    total_input = 0
    for record, prompt in zip(run.records, prompts, strict=True):
        if not record.is_ok:
            continue
        if record.prompt_tokens is not None:
            total_input += record.prompt_tokens
        elif isinstance(prompt, list):
            total_input += len(prompt)
    return LoadPointResult(
        load=load,
        num_requests=len(run.records),
        num_completed=len(completed),
        num_failed=len(failed),
        first_error=failed[0].error if failed else None,
        duration_s=run.duration_s,
        total_input_tokens=total_input,
        total_output_tokens=sum(r.output_tokens for r in completed),
        max_in_flight=run.max_in_flight,
        ttft_ms=summarize([r.ttft * 1e3 for r in completed if r.ttft is not None]),
        tpot_ms=summarize([r.tpot * 1e3 for r in completed if r.tpot is not None]),
        itl_ms=summarize([gap * 1e3 for r in completed for gap in r.itl]),
        e2e_ms=summarize([r.e2e * 1e3 for r in completed if r.e2e is not None]),
        records=run.records,
    )
