"""Where a step's time goes: host time in the engine's named ranges, and GPU busy vs idle.

Runs a window of engine steps under ``torch.profiler`` (CPU + CUDA activities). Host time is
the summed duration of the ``record_function`` ranges the engine and runner emit; GPU busy is
the union of kernel, memcpy and memset intervals on the device timeline, clipped to the window;
idle is the rest of the window's wall time. All times come from the profiler's one clock. The
kernels that take the most GPU time are listed too, per step, so the next thing to fuse is visible.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# The engine core's phases, then the offline engine's turning of a step's updates into outputs (detokenizing,
# stops): in a server that part runs in the server's process, not in the step.
STEP_RANGES = ("infer.schedule", "infer.prepare_inputs", "infer.forward", "infer.sample", "infer.process_outputs",
               "infer.detokenize")
WINDOW_RANGE = "infer.bench.window"
_DEVICE_ACTIVITIES = {"kernel", "gpu_memcpy", "gpu_memset"}
NUM_TOP_KERNELS = 15
# Idle gaps shorter than this sit between kernels queued back to back (a graph's kernel-to-kernel launch
# latency); longer ones are the GPU waiting for the host to launch more work.
SHORT_GAP_US = 10.0


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def _idle_gaps(intervals: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """Lengths of the idle stretches between the busy intervals inside ``[start, end]``."""
    gaps, cursor = [], start
    for lo, hi in sorted(intervals):
        if lo > cursor:
            gaps.append(lo - cursor)
        cursor = max(cursor, hi)
    if end > cursor:
        gaps.append(end - cursor)
    return gaps


def summarize_trace(events: list[dict[str, Any]], num_steps: int) -> dict[str, Any]:
    """The breakdown from a Chrome trace's ``traceEvents`` (times in microseconds).

    The exported trace is read rather than the profiler's Python objects: its format is stable
    across torch versions, their attributes are not.
    """
    window = [e for e in events if e.get("name") == WINDOW_RANGE and e.get("cat") == "user_annotation"]
    if len(window) != 1:
        raise RuntimeError(f"expected one {WINDOW_RANGE!r} range in the profile, found {len(window)}")
    start = float(window[0]["ts"])
    end = start + float(window[0]["dur"])
    wall = end - start
    host: dict[str, dict[str, Any]] = {name: {"count": 0, "us": 0.0} for name in STEP_RANGES}
    device: list[tuple[float, float]] = []
    kernels: dict[str, list[float]] = {}  # name -> [calls, us]
    for e in events:
        kind, name = e.get("cat"), e.get("name")
        if kind == "user_annotation" and name in host:
            host[name]["count"] += 1
            host[name]["us"] += float(e.get("dur", 0))
        elif kind in _DEVICE_ACTIVITIES and "ts" in e:
            lo, hi = max(start, float(e["ts"])), min(end, float(e["ts"]) + float(e.get("dur", 0)))
            if hi > lo:
                device.append((lo, hi))
                totals = kernels.setdefault(str(name), [0, 0.0])
                totals[0] += 1
                totals[1] += hi - lo
    per_step = 1e3 * max(1, num_steps)  # us -> ms per step
    ranges = {name: {"count": v["count"], "ms_per_step": round(v["us"] / per_step, 4)} for name, v in host.items()}
    named = sum(v["us"] for v in host.values())
    breakdown: dict[str, Any] = {
        "num_steps": num_steps,
        "wall_ms_per_step": round(wall / per_step, 4),
        "host_ranges": ranges,
        "host_other_ms_per_step": round(max(0.0, wall - named) / per_step, 4),
        "missing_ranges": [name for name, v in host.items() if v["count"] == 0],
        "gpu_lead_in_ms": None,
        "gpu_busy_ms_per_step": None,
        "gpu_idle_ms_per_step": None,
        "gpu_busy_fraction": None,
        "gpu_idle_short_gaps_ms_per_step": None,
        "gpu_idle_long_gaps_ms_per_step": None,
        "top_kernels": [
            {"name": name, "calls_per_step": round(calls / max(1, num_steps), 2),
             "us_per_step": round(us / max(1, num_steps), 2)}
            for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:NUM_TOP_KERNELS]
        ],
    }
    if device or torch.cuda.is_available():
        # The window opens on a drained device, so the first step's host work before its first launch has an
        # idle GPU, where in a running loop it overlaps the step before: that lead-in is reported apart, and
        # idle time is counted from the first device activity on.
        first = min((lo for lo, _ in device), default=end)
        busy = _union(device)
        gaps = _idle_gaps(device, first, end)
        short = sum(g for g in gaps if g < SHORT_GAP_US)
        breakdown.update(
            gpu_lead_in_ms=round((first - start) / 1e3, 4),
            gpu_idle_short_gaps_ms_per_step=round(short / per_step, 4),
            gpu_idle_long_gaps_ms_per_step=round((sum(gaps) - short) / per_step, 4),
            gpu_busy_ms_per_step=round(busy / per_step, 4),
            gpu_idle_ms_per_step=round((end - first - busy) / per_step, 4),
            gpu_busy_fraction=round(busy / (end - first), 4) if end > first else None,
        )
    return breakdown


def profile_steps(step: Callable[[], Any], num_steps: int, trace_path: Path | None = None) -> dict[str, Any]:
    """Call ``step`` ``num_steps`` times under the profiler and return the breakdown per step.

    The window starts and ends with the device drained, so its GPU work all falls inside it.
    The trace is kept at ``trace_path`` when given.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    is_cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
    if is_cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        with record_function(WINDOW_RANGE):
            for _ in range(num_steps):
                step()
            if is_cuda:
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="infer-profile-") as scratch:
        path = trace_path or Path(scratch) / "trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    breakdown = summarize_trace(events, num_steps)
    if trace_path is not None:
        breakdown["trace"] = str(trace_path)
    return breakdown


def format_breakdown(label: str, breakdown: dict[str, Any]) -> str:
    """The breakdown as aligned lines, for the terminal."""
    lines = [f"step breakdown, {label}: {breakdown['num_steps']} steps, {breakdown['wall_ms_per_step']:.3f} ms/step"]
    for name, value in breakdown["host_ranges"].items():
        note = "" if value["count"] else "  (range not emitted)"
        lines.append(f"  {name:<24}{value['ms_per_step']:>10.3f} ms{note}")
    lines.append(f"  {'host, outside ranges':<24}{breakdown['host_other_ms_per_step']:>10.3f} ms")
    if breakdown.get("gpu_busy_ms_per_step") is not None:
        lines.append(f"  {'GPU busy':<24}{breakdown['gpu_busy_ms_per_step']:>10.3f} ms")
        lines.append(f"  {'GPU idle':<24}{breakdown['gpu_idle_ms_per_step']:>10.3f} ms"
                     f"  ({100 * (1 - breakdown['gpu_busy_fraction']):.1f}% of the window)")
        if breakdown.get("gpu_idle_short_gaps_ms_per_step") is not None:
            lines.append(f"    {'gaps < ' + format(SHORT_GAP_US, 'g') + ' us':<22}"
                         f"{breakdown['gpu_idle_short_gaps_ms_per_step']:>10.3f} ms  (kernel to kernel)")
            lines.append(f"    {'longer gaps':<22}{breakdown['gpu_idle_long_gaps_ms_per_step']:>10.3f} ms"
                         f"  (waiting for the host)")
    if breakdown.get("top_kernels"):
        lines.append("  GPU time by kernel (per step):")
        for kernel in breakdown["top_kernels"]:
            lines.append(f"    {kernel['us_per_step']:>9.1f} us {kernel['calls_per_step']:>7.1f} calls  "
                         f"{kernel['name'][:90]}")
    return "\n".join(lines)
