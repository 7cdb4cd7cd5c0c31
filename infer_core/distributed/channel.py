"""The control channel between rank 0 and the other ranks of a multi-rank engine: pickled messages on a c10d store.

Rank 0 pushes each message (a method call) to one queue per worker; a worker pops its queue,
runs the call and, when asked, pushes the result to its reply queue. The store is the one the
process group rendezvoused on (a ``TCPStore`` served by rank 0, or torchrun's), so no transport
of our own is needed and a worker blocked on its queue notices at once when rank 0 is gone.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from infer_core.interfaces import EngineDeadError

IDLE_POLL = timedelta(hours=1)  # how long a worker's blocking pop waits before it simply waits again


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``method(*args)`` on a rank; ``reply`` says whether rank 0 waits for the result."""

    method: str
    args: tuple[Any, ...] = ()
    reply: bool = True


@dataclass(frozen=True, slots=True)
class Reply:
    rank: int
    ok: bool
    value: Any  # the result, or the formatted traceback when not ok


def _to_queue(rank: int) -> str:
    return f"to/{rank}"


def _from_queue(rank: int) -> str:
    return f"from/{rank}"


class LeaderChannel:
    """Rank 0's end: send a call to every worker, collect their replies while watching liveness."""

    def __init__(self, store: dist.Store, world_size: int) -> None:
        self.store = dist.PrefixStore("ranks/control", store)
        self.worker_ranks = list(range(1, world_size))

    def send(self, call: Call) -> None:
        data = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)  # pickled once for every worker
        for rank in self.worker_ranks:
            self.store.queue_push(_to_queue(rank), data)

    def wait_for(self, rank: int, check_alive: Callable[[], None], timeout: float | None = None) -> Reply:
        """The next reply of ``rank``; polls without blocking so a dead worker is noticed at once."""
        key = _from_queue(rank)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 1e-4
        while self.store.queue_len(key) == 0:
            check_alive()
            if deadline is not None and time.monotonic() > deadline:
                raise EngineDeadError(f"rank {rank} did not answer within {timeout:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return pickle.loads(self.store.queue_pop(key))

    def collect(self, check_alive: Callable[[], None]) -> list[Any]:
        """Every worker's result of the last call, by rank; a failed call raises EngineDeadError."""
        values = []
        for rank in self.worker_ranks:
            reply = self.wait_for(rank, check_alive)
            if not reply.ok:
                raise EngineDeadError(f"rank {rank} failed:\n{reply.value}")
            values.append(reply.value)
        return values


class WorkerChannel:
    """A worker's end: receive the next call (waiting as long as the engine is idle), reply."""

    def __init__(self, store: dist.Store, rank: int) -> None:
        listener = store.clone()  # its own connection, whose timeout is the idle wait
        listener.set_timeout(IDLE_POLL)
        self.inbox = dist.PrefixStore("ranks/control", listener)
        self.store = dist.PrefixStore("ranks/control", store)
        self.rank = rank

    def receive(self) -> Call:
        """Block until rank 0 sends a call; DistNetworkError when rank 0's store is gone."""
        while True:
            try:
                return pickle.loads(self.inbox.queue_pop(_to_queue(self.rank)))
            except dist.DistNetworkError:
                raise
            except dist.DistStoreError:
                continue  # an idle engine: keep waiting

    def reply(self, ok: bool, value: Any) -> None:
        self.store.queue_push(_from_queue(self.rank), pickle.dumps(Reply(self.rank, ok, value)))
