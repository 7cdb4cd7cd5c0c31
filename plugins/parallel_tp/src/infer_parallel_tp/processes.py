"""Ranks 1..N-1 as child processes of the engine's process (``spawn``), watched for death."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable

from infer_parallel_tp.group import RankPlacement
from infer_parallel_tp.worker_main import spawn_entry

logger = logging.getLogger(__name__)

REAP_WAIT = 2.0  # seconds to wait for the exit status of a worker whose process handle closed


def describe_exit(code: int) -> str:
    """``exited with code -9 (SIGKILL)``: multiprocessing's exit code, with the signal's name."""
    if code < 0:
        try:
            return f"exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"exited with code {code} (signal {-code})"
    return f"exited with code {code}"


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
        """A line per worker that exited, naming its rank, pid and exit code (or signal).

        Cheap enough for every step: one ``waitpid(WNOHANG)`` per worker.
        """
        return [self._describe(rank, p) for rank, p in zip(self.ranks, self.processes) if p.exitcode is not None]

    def failures_of(self, sentinels: list[int]) -> list[str]:
        """The lines of the workers whose process handles (``sentinel``) closed.

        A closed handle comes a moment before the exit status can be read (the process is still
        exiting), so this waits up to REAP_WAIT s for it; the line names the rank either way.
        """
        lines = []
        for rank, process in zip(self.ranks, self.processes):
            if process.sentinel in sentinels:
                process.join(REAP_WAIT)
                lines.append(self._describe(rank, process))
        return lines

    @staticmethod
    def _describe(rank: int, process) -> str:
        code = process.exitcode
        how = "exited (exit status not known yet)" if code is None else describe_exit(code)
        return f"rank {rank} (pid {process.pid}) {how}"

    def watch(self, on_death: Callable[[list[str]], None]) -> None:
        """Call ``on_death(lines)`` from a daemon thread as soon as any worker exits unasked."""
        sentinels = [p.sentinel for p in self.processes]

        def wait() -> None:
            ready = multiprocessing.connection.wait(sentinels)
            if not self._stopping:
                on_death(self.failures_of(ready))

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
