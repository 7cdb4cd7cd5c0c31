"""The engine-core process's step timeline: how many steps it ran, of how many tokens, in how long, and what
sending their outputs to the server cost; totals since start, relayed with every step's counters.

``/metrics`` serves them (``infer:engine_core_*``), and ``infer bench serve`` reads them before and after a load
point: were the core's steps as many and as fast as the offline engine's on the same prompts (then a gap is
the requests' arrival, or the server draining the outputs), or slower (then the core's own sending costs)?

A step is ``prefill`` when it runs more tokens than requests (some prompt tokens), else ``decode``, as the
offline benchmark's timeline counts them (bench/timeline.py). A step's time is that of the ``EngineCore.step``
call that launched it; with overlapped scheduling that call also waits for the step before it, so it is the
pipeline's period. A call that launches nothing (the last of a busy period, reading the step still in flight)
adds its time to the kind of the step it reads, and counts no step. ``send`` is the time spent turning each
step's updates into the server's message (columns, pickling). ``busy`` is the loop's wall time from the first
step after an idle wait to the last send before the next one: a window's idle time is its length less the
busy time that grew within it. A message carries the totals as they were at its step's end (its own sending
counts in the next message's). The counting is a few additions per step, on the core process's loop only
(the offline engine does not count).
"""

from __future__ import annotations

from typing import NamedTuple

from infer_core.interfaces import SchedulerOutput


class StepTotals(NamedTuple):
    """The tally at one moment (picklable: it travels in ``CoreCounters``)."""

    prefill_steps: int = 0
    prefill_tokens: int = 0  # tokens scheduled in prefill steps (prompt chunks and the decodes beside them)
    prefill_seconds: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    send_seconds: float = 0.0
    busy_seconds: float = 0.0


class StepTally:
    """The running totals; one per core loop, called on its thread."""

    __slots__ = ("prefill_steps", "prefill_tokens", "prefill_seconds", "decode_steps", "decode_tokens",
                 "decode_seconds", "send_seconds", "busy_seconds", "_last_prefill", "_busy_until")

    def __init__(self) -> None:
        self.prefill_steps = self.prefill_tokens = self.decode_steps = self.decode_tokens = 0
        self.prefill_seconds = self.decode_seconds = self.send_seconds = self.busy_seconds = 0.0
        self._last_prefill = False  # the kind of the last step launched
        self._busy_until: float | None = None  # when the last send ended, in a busy period (None: idle since)

    def stepped(self, plan: SchedulerOutput | None, started: float, ended: float) -> None:
        """A ``step`` call from ``started`` to ``ended`` (``time.perf_counter``) that launched ``plan``."""
        seconds = ended - started
        if plan is not None and plan.num_scheduled_tokens:
            tokens = plan.total_num_scheduled_tokens
            self._last_prefill = tokens > len(plan.num_scheduled_tokens)
            if self._last_prefill:
                self.prefill_steps += 1
                self.prefill_tokens += tokens
            else:
                self.decode_steps += 1
                self.decode_tokens += tokens
        if self._last_prefill:
            self.prefill_seconds += seconds
        else:
            self.decode_seconds += seconds
        since = self._busy_until
        self.busy_seconds += ended - (started if since is None else since)

    def sent(self, started: float, ended: float) -> None:
        """The step's outputs were sent from ``started`` (the step's end) to ``ended``."""
        self.send_seconds += ended - started
        self.busy_seconds += ended - started
        self._busy_until = ended

    def idle(self) -> None:
        """The loop waits for work: the next step starts a new busy period."""
        self._busy_until = None

    def totals(self) -> StepTotals:
        return StepTotals(self.prefill_steps, self.prefill_tokens, self.prefill_seconds, self.decode_steps,
                          self.decode_tokens, self.decode_seconds, self.send_seconds, self.busy_seconds)
