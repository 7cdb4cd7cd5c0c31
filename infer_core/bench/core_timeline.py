"""The engine core's step timeline over one load point of ``infer bench serve``, beside the offline engine's.

An infer server's ``/metrics`` carries the core loop's step totals (``infer:engine_core_*``,
engine/step_tally.py); the benchmark reads them before and after each load point, while the core is idle,
and the difference says what the core did for that load: steps of each kind, tokens per step, time per step,
the time spent sending outputs to the server, and how long it was idle in the window. The offline row gets
the same figures from its scheduler's steps (``StepTimeline.by_kind``), so the two read side by side:

- the server's steps as many and as fast as offline, idle time large: the gap is the requests' arrival or the
  server's draining of outputs, not the core;
- steps as many but slower, or send time large: the core's own output sending costs;
- more, smaller decode steps: the server fed the core fewer requests at once.

A server without these series (a peer, an older infer) gives no timeline: the load point's row says nothing.
"""

from __future__ import annotations

import re
from typing import Any

PREFIX = "infer:engine_core_"
KINDS = ("prefill", "decode")
_KIND = re.compile(r'kind="(\w+)"')


def parse_core_totals(text: str) -> dict[str, float] | None:
    """The ``infer:engine_core_*`` samples of a Prometheus exposition, by name (and ``:kind``); None without any."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0][len(PREFIX):].removesuffix("_total")
        kind = _KIND.search(series)
        totals[f"{name}:{kind.group(1)}" if kind else name] = float(value)
    return totals or None


async def read_core_totals(client, base: str, headers: dict[str, str]) -> dict[str, float] | None:
    """GET ``<base>/metrics`` and parse it; None where the server serves no step timeline."""
    try:
        response = await client.get(base + "/metrics", headers=headers)
    except Exception:  # a peer without /metrics, or a server gone: no timeline, the load's figures stand
        return None
    return parse_core_totals(response.text) if response.status_code == 200 else None


def _kind(steps: float, tokens: float, seconds: float) -> dict[str, Any]:
    return {"steps": int(steps), "tokens": int(tokens), "seconds": round(seconds, 4),
            "tokens_per_step": round(tokens / steps, 1) if steps else None,
            "ms_per_step": round(1e3 * seconds / steps, 3) if steps else None}


def core_timeline(before: dict[str, float] | None, after: dict[str, float] | None,
                  window_s: float) -> dict[str, Any] | None:
    """What the core did between two reads ``window_s`` seconds apart (None unless both reads had the series)."""
    if before is None or after is None:
        return None

    def grown(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    busy = grown("busy_seconds")
    timeline: dict[str, Any] = {kind: _kind(grown(f"steps:{kind}"), grown(f"step_tokens:{kind}"),
                                            grown(f"step_seconds:{kind}")) for kind in KINDS}
    timeline.update(window_s=round(window_s, 4), busy_s=round(busy, 4), idle_s=round(max(0.0, window_s - busy), 4),
                    send_s=round(grown("output_send_seconds"), 4))
    return timeline


def offline_timeline(by_kind: dict[str, tuple[int, int, float]], duration_s: float) -> dict[str, Any]:
    """The offline engine's steps in the shape of ``core_timeline``: busy the whole run, sending nothing."""
    timeline: dict[str, Any] = {kind: _kind(*by_kind.get(kind, (0, 0, 0.0))) for kind in KINDS}
    timeline.update(window_s=round(duration_s, 4), busy_s=round(duration_s, 4), idle_s=0.0, send_s=None)
    return timeline


def format_core_timeline(timeline: dict[str, Any], width: int = 20) -> list[str]:
    """Two lines of a load point's block: the steps by kind, and where the window's time went."""
    parts = []
    for kind in KINDS:
        k = timeline[kind]
        parts.append(f"{kind} {k['steps']} x {k['tokens_per_step'] or 0:.1f} tok, {k['ms_per_step'] or 0:.2f} ms")
    time_line = (f"busy {timeline['busy_s']:.3f} s of {timeline['window_s']:.3f} (idle {timeline['idle_s']:.3f} s); "
                 f"in steps {timeline['prefill']['seconds'] + timeline['decode']['seconds']:.3f} s")
    if timeline.get("send_s") is not None:
        time_line += f", sending outputs {timeline['send_s']:.3f} s"
    return [f"{'core steps':<{width}}{' | '.join(parts)}", f"{'core time':<{width}}{time_line}"]
