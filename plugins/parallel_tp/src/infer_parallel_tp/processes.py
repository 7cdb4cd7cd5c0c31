"""Ranks 1..N-1 as child processes of the engine's process (``spawn``), watched for death."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable

from infer_parallel_tp.group import RankPlacement
from infer_parallel_tp.worker_main import spawn_entry

logger = logging.getLogger(__name__)


class SpawnedWorkers:
    """The worker processes of one executor; ``failures`` says which died and how."""

    def __init__(self, placements: list[RankPlacement], host: str, port: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.processes = [
            context.Process(
                target=spawn_entry, args=(p, host, port, os.getpid()), name=f"infer-tp-rank-{p.rank}", daemon=True
            )
            for p in placements
        ]
        self.ranks = [p.rank for p in placements]
        self._stopping = False
        for process in self.processes:
            process.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def failures(self) -> list[str]:
        """A line per worker that exited (while not being stopped)."""
        return [
            f"rank {rank} (pid {p.pid}) exited with code {p.exitcode}"
            for rank, p in zip(self.ranks, self.processes)
            if p.exitcode is not None
        ]

    def watch(self, on_death: Callable[[], None]) -> None:
        """Call ``on_death`` from a daemon thread as soon as any worker exits unasked."""
        sentinels = [p.sentinel for p in self.processes]

        def wait() -> None:
            multiprocessing.connection.wait(sentinels)
            if not self._stopping:
                on_death()

        if sentinels:
            threading.Thread(target=wait, name="infer-tp-watch", daemon=True).start()

    def expect_exit(self) -> None:
        """From now on an exiting worker is being stopped, not dying."""
        self._stopping = True

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the workers to exit, then kill those left; reap all."""
        self._stopping = True
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        self._stopping = True
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
        for process in self.processes:
            process.join()
