"""The all-reduce dispatch's load counters on the device (``counted.py`` adds each eager step's routing on rank 0),
read back without stopping the step in flight.

A read copies the counters into pinned host memory on the stream that counted them, zeroes them there, and records
an event; the copy is folded in once its event has passed: at the next read by the engine's loop, or at once when
the reader waits (``describe``). Reading them with a plain ``.cpu()`` would make the engine's loop wait for the
step it has just launched, once a second, and on a dead peer's collective.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

Counts = tuple[torch.Tensor, torch.Tensor, int]  # entries per expert, token rows per rank, busiest-rank entries


@dataclass
class _Copy:
    host: list[torch.Tensor]
    event: torch.cuda.Event | None  # None: a CPU copy, complete when made

    def done(self) -> bool:
        return self.event is None or self.event.query()

    def counts(self) -> Counts:
        if self.event is not None:
            self.event.synchronize()
        entries, tokens, busiest = self.host
        return entries, tokens, int(busiest)


class DeviceLoad:
    """Entries per expert, token rows per rank (a token with several experts on one rank counts once there) and the
    busiest rank's entries summed over layers, on the device since they were last taken."""

    def __init__(self, num_experts: int, world_size: int, device: torch.device) -> None:
        self.world_size = world_size
        self.experts_per_rank = num_experts // world_size
        self.counters = [torch.zeros(num_experts, dtype=torch.int64, device=device),
                         torch.zeros(world_size, dtype=torch.int64, device=device),
                         torch.zeros((), dtype=torch.int64, device=device)]
        self.stream: torch.cuda.Stream | None = None  # the stream of the latest add (CUDA)
        self._pending: _Copy | None = None

    def add(self, topk_ids: torch.Tensor) -> None:
        """One layer's routing [tokens, top_k] (global expert ids), counted with device ops only."""
        entries, tokens, busiest = self.counters
        if topk_ids.is_cuda:
            self.stream = torch.cuda.current_stream(topk_ids.device)
        ids = topk_ids.long()
        layer = torch.zeros_like(entries).index_add_(0, ids.reshape(-1), torch.ones_like(ids).reshape(-1))
        entries += layer
        busiest += layer.view(self.world_size, -1).sum(1).max()
        hits = torch.zeros((ids.shape[0], self.world_size), dtype=torch.bool, device=ids.device)
        tokens += hits.scatter_(1, ids // self.experts_per_rank, True).sum(0)

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
