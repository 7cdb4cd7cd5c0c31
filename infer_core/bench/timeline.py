"""Where a throughput run's wall time goes: steps grouped by kind and batch size.

A step is timed from one ``schedule()`` call to the next (with overlapped scheduling that is the
pipeline's period: host and GPU work of neighbouring steps overlap). The scheduler is wrapped on
the instance, in the benchmark; the engine is not edited. Steps that run any prompt tokens count as
``prefill``; the rest, decode-only, are grouped by how many requests they decode, so the share of
the run spent in the small-batch tail is visible next to the large-batch middle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

NUM_SLOWEST = 5
DECODE_BUCKETS = ((1, 8), (9, 32), (33, 64), (65, 128), (129, 192), (193, 256), (257, 1 << 30))


@dataclass(slots=True)
class StepTimeline:
    """Per-step (start time, requests, tokens) of one run, from the scheduler's outputs."""

    starts: list[float] = field(default_factory=list)
    num_reqs: list[int] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)

    def attach(self, scheduler) -> None:
        """Record every non-empty plan ``scheduler.schedule()`` returns (wraps the instance's method)."""
        schedule = scheduler.schedule

        def timed_schedule():
            started = time.perf_counter()
            plan = schedule()
            if not plan.is_empty:
                self.starts.append(started)
                self.num_reqs.append(len(plan.num_scheduled_tokens))
                self.num_tokens.append(plan.total_num_scheduled_tokens)
            return plan

        scheduler.schedule = timed_schedule

    def detach(self, scheduler) -> None:
        scheduler.__dict__.pop("schedule", None)

    def slowest(self, end: float) -> list[dict[str, Any]]:
        """The ``NUM_SLOWEST`` longest steps: one stall (a compile, a GC pass) shows up here whole."""
        bounds = self.starts[1:] + [end]
        steps = [{"step": i, "ms": round(1e3 * (stop - start), 3), "num_reqs": reqs, "num_tokens": tokens}
                 for i, (start, stop, reqs, tokens) in enumerate(zip(self.starts, bounds, self.num_reqs,
                                                                       self.num_tokens))]
        return sorted(steps, key=lambda s: -s["ms"])[:NUM_SLOWEST]

    def by_kind(self, end: float) -> dict[str, tuple[int, int, float]]:
        """(steps, tokens, seconds) of the prefill and of the decode steps, as a server's core counts them
        (engine/step_tally.py)."""
        kinds = {"prefill": [0, 0, 0.0], "decode": [0, 0, 0.0]}
        for start, stop, reqs, tokens in zip(self.starts, self.starts[1:] + [end], self.num_reqs, self.num_tokens):
            kind = kinds["prefill" if tokens > reqs else "decode"]
            kind[0] += 1
            kind[1] += tokens
            kind[2] += stop - start
        return {name: (steps, tokens, seconds) for name, (steps, tokens, seconds) in kinds.items()}

    def summary(self, end: float) -> dict[str, Any]:
        """Seconds and steps per group; a step lasts until the next one starts (the last, until ``end``)."""
        groups: dict[str, dict[str, float]] = {}
        bounds = self.starts[1:] + [end]
        for start, stop, reqs, tokens in zip(self.starts, bounds, self.num_reqs, self.num_tokens):
            if tokens > reqs:
                name = "prefill"
            else:
                lo, hi = next(b for b in DECODE_BUCKETS if b[0] <= reqs <= b[1])
                name = f"decode {lo}-{hi}" if hi < 1 << 30 else f"decode {lo}+"
            group = groups.setdefault(name, {"steps": 0, "seconds": 0.0, "tokens": 0})
            group["steps"] += 1
            group["seconds"] += stop - start
            group["tokens"] += tokens
        return {
            name: {"steps": int(g["steps"]), "seconds": round(g["seconds"], 4),
                   "ms_per_step": round(1e3 * g["seconds"] / g["steps"], 3), "tokens": int(g["tokens"])}
            for name, g in sorted(groups.items(), key=lambda kv: _order(kv[0]))
        }


def _order(name: str) -> int:
    return -1 if name == "prefill" else int(name.split()[1].split("-")[0].rstrip("+"))


def format_timeline(label: str, summary: dict[str, Any], slowest: list[dict[str, Any]],
                    compiled: list[str]) -> str:
    lines = [f"step timeline, {label}:"]
    for name, g in summary.items():
        lines.append(f"  {name:<16}{g['steps']:>6} steps {g['seconds']:>8.3f} s {g['ms_per_step']:>8.3f} ms/step "
                     f"{g['tokens']:>8} tokens")
    lines.append("  slowest steps: " + ", ".join(
        f"#{s['step']} {s['ms']:.1f} ms ({s['num_reqs']} reqs, {s['num_tokens']} tokens)" for s in slowest))
    lines.append(f"  Triton compiles during the run: {', '.join(compiled) if compiled else 'none'}")
    return "\n".join(lines)
