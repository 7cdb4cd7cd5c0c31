"""The all-reduce dispatch's load counters on the device (``counted.py`` adds the routing of each step that is not a
whole-step graph's replay, on rank 0), read back without stopping the step in flight.

A read copies the counters into pinned host memory on the stream that counted them, zeroes them there, and records
an event; the copy is folded in once its event has passed: at the next read by the engine's loop, or at once when
the reader waits (``describe``). Reading them with a plain ``.cpu()`` would make the engine's loop wait for the
step it has just launched, once a second, and on a dead peer's collective.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

# entries per expert, token rows per rank, busiest-rank entries, dispatches (layer calls counted), tokens routed
Counts = tuple[torch.Tensor, torch.Tensor, int, int, int]


@dataclass
class _Copy:
    host: list[torch.Tensor]
    event: torch.cuda.Event | None  # None: a CPU copy, complete when made

    def done(self) -> bool:
        return self.event is None or self.event.query()

    def counts(self) -> Counts:
        if self.event is not None:
            self.event.synchronize()
        entries, tokens, busiest, dispatches, routed = self.host
        return entries, tokens, int(busiest), int(dispatches), int(routed)


class DeviceLoad:
    """Entries per expert, token rows per rank (a token with several experts on one rank counts once there), the
    busiest rank's entries summed over layers, the layer calls counted and the tokens they routed, on the device
    since they were last taken.

    ``step_rows``: the real rows of the step being run (the executor writes it before each step), so that a step
    padded to a piecewise graph's size counts only its own tokens: the counting ops are captured into the pieces
    and replayed with them.
    """

    def __init__(self, num_experts: int, world_size: int, device: torch.device) -> None:
        self.world_size = world_size
        self.experts_per_rank = num_experts // world_size
        zero = torch.zeros((), dtype=torch.int64, device=device)
        self.counters = [torch.zeros(num_experts, dtype=torch.int64, device=device),
                         torch.zeros(world_size, dtype=torch.int64, device=device),
                         zero.clone(), zero.clone(), zero.clone()]
        self.step_rows = zero.clone()
        self.stream: torch.cuda.Stream | None = None  # the steps' stream (CUDA): counts are read on it
        self._pending: _Copy | None = None

    def add(self, topk_ids: torch.Tensor, padded: bool = False) -> None:
        """One layer's routing [rows, top_k] (global expert ids), counted with device ops only; ``padded``: only
        the first ``step_rows`` rows are the step's."""
        entries, tokens, busiest, dispatches, routed = self.counters
        if self.stream is None and topk_ids.is_cuda and not torch.cuda.is_current_stream_capturing():
            self.stream = torch.cuda.current_stream(topk_ids.device)  # until the steps' own is known
        ids = topk_ids.long()
        if padded:
            real = torch.arange(ids.shape[0], device=ids.device) < self.step_rows  # [rows]
            ones = real.unsqueeze(1).expand_as(ids).long()
            routed += self.step_rows
        else:
            real, ones = None, torch.ones_like(ids)
            routed += ids.shape[0]
        layer = torch.zeros_like(entries).index_add_(0, ids.reshape(-1), ones.reshape(-1))
        entries += layer
        busiest += layer.view(self.world_size, -1).sum(1).max()
        dispatches += 1
        hits = torch.zeros((ids.shape[0], self.world_size), dtype=torch.bool, device=ids.device)
        hits.scatter_(1, ids // self.experts_per_rank, True)
        if real is not None:
            hits &= real.unsqueeze(1)
        tokens += hits.sum(0)

    def set_step_rows(self, rows: int) -> None:
        """The next step's real rows, written on the stream the step will run on, before it: the stream the counts
        are then read on (a capture's stream, or a piecewise warm-up's, is not the steps')."""
        if self.step_rows.is_cuda:
            self.stream = torch.cuda.current_stream(self.step_rows.device)
        with torch.inference_mode():  # the counters were made in the forward's inference mode
            self.step_rows.fill_(rows)

    def zero(self) -> None:
        """Every counter to zero, in place (captured graphs hold these tensors); what was taken is dropped. Called
        between steps (``ExpertLoad.reset``, after start-up), on the steps' stream."""
        with torch.inference_mode():
            for t in self.counters:
                t.zero_()
        self._pending = None

    def take(self, wait: bool) -> list[Counts]:
        """The copies that reached the host: the last read's, if its copy is done (or ``wait``); then a new copy of
        what was counted since, started now and, with ``wait``, waited for."""
        taken = []
        if self._pending is not None and (wait or self._pending.done()):
            taken.append(self._pending.counts())
            self._pending = None
        if self._pending is None:
            self._pending = self._copy()
            if wait or self._pending.event is None:
                taken.append(self._pending.counts())
                self._pending = None
        return taken

    def _copy(self) -> _Copy:
        pinned = self.stream is not None
        # the counters were made in the forward's inference mode: only that mode may update them in place
        with torch.inference_mode(), torch.cuda.stream(self.stream) if pinned else nullcontext():
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned) for t in self.counters]
            for h, t in zip(host, self.counters):
                h.copy_(t, non_blocking=pinned)
                t.zero_()
            event = torch.cuda.Event() if pinned else None
            if event is not None:
                event.record(self.stream)
        return _Copy(host, event)
