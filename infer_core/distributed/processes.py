"""Ranks 1..N-1 as child processes of the engine's process, watched for death, their stderr kept.

A worker is a fresh interpreter that runs ``rank_loop.spawn_main``: it finds the modules this
process found (this process's ``sys.path`` is its PYTHONPATH) and connects to rank 0's store. It
does not run this program's main module again (multiprocessing's spawn would), so a script that
builds a multi-rank ``LLM`` needs no ``if __name__ == "__main__":`` guard.

A worker's stderr is a pipe: a thread here copies what it writes to this process's stderr as it
comes and keeps the last of it, so a worker that dies, at start or later, is reported with its own
last words (a traceback, a CUDA error, a message of the C++ runtime), not only its exit code.
"""

from __future__ import annotations

import codecs
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from infer_core.distributed.group import RankPlacement

logger = logging.getLogger(__name__)

# What a worker's interpreter runs; its arguments follow (see ``rank_loop.spawn_main``).
ENTRY = "import sys; from infer_core.distributed.rank_loop import spawn_main; sys.exit(spawn_main(sys.argv[1:]))"
TAIL_BYTES = 16384  # of a worker's stderr kept for its death report
TAIL_LINES = 20  # lines of it an EngineDeadError quotes
DRAIN_WAIT = 2.0  # seconds a death report waits for the rest of a dead worker's stderr


def describe_exit(code: int) -> str:
    """``exited with code -9 (SIGKILL)``: the exit code, with the signal's name."""
    if code < 0:
        try:
            return f"exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"exited with code {code} (signal {-code})"
    return f"exited with code {code}"


def _forward(text: str) -> None:
    """Write a worker's output to this process's stderr (gone at interpreter exit: then dropped)."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


class StderrTail:
    """A worker's stderr pipe: copied to ours as it comes by a thread, its last TAIL_BYTES kept."""

    def __init__(self, stream, rank: int) -> None:
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._pump, args=(stream,), name=f"infer-rank-stderr-{rank}", daemon=True).start()

    def _pump(self, stream) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while chunk := os.read(stream.fileno(), 65536):
                with self._lock:
                    self._tail += chunk
                    del self._tail[:-TAIL_BYTES]
                _forward(decoder.decode(chunk))
            _forward(decoder.decode(b"", final=True))
        finally:
            stream.close()
            self._closed.set()

    def last_lines(self, wait: float) -> list[str]:
        """The last TAIL_LINES non-empty lines, once the pipe closed or after ``wait`` s (a child of the
        worker may hold it open)."""
        self._closed.wait(wait)
        with self._lock:
            text = self._tail.decode("utf-8", errors="replace")
        return [line.rstrip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]


class SpawnedWorkers:
    """The worker processes of one executor; ``failures`` says which died and how, ``last_words`` what they said."""

    def __init__(self, placements: list[RankPlacement], host: str, port: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        self.ranks = [p.rank for p in placements]
        self.processes: list[subprocess.Popen] = []
        self.tails: list[StderrTail] = []
        self._stopping = False
        self._on_death: Callable[[list[str]], None] | None = None
        try:
            for p in placements:
                args = [p.rank, p.world_size, p.local_rank, p.backend, host, port, os.getpid()]
                process = subprocess.Popen([sys.executable, "-c", ENTRY, *map(str, args)], env=env,
                                           stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
                self.processes.append(process)
                self.tails.append(StderrTail(process.stderr, p.rank))
                # reaps the process as soon as it exits (so ``returncode`` is set) and reports it
                threading.Thread(target=self._reap, args=(process,), name=f"infer-rank-watch-{p.rank}",
                                 daemon=True).start()
        except BaseException:
            self.kill()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def _reap(self, process: subprocess.Popen) -> None:
        process.wait()
        on_death = self._on_death
        if on_death is not None and not self._stopping:
            on_death(self.failures())

    def failures(self) -> list[str]:
        """A line per worker that exited, naming its rank, pid and exit code (or signal).

        Cheap enough for every step: it reads the exit codes the reaping threads set.
        """
        return [f"rank {rank} (pid {p.pid}) {describe_exit(p.returncode)}"
                for rank, p in zip(self.ranks, self.processes) if p.returncode is not None]

    def last_words(self) -> str:
        """The last stderr lines of every worker that exited, under a line naming its rank ('' if none)."""
        blocks = []
        for rank, process, tail in zip(self.ranks, self.processes, self.tails):
            if process.returncode is not None:
                lines = tail.last_lines(DRAIN_WAIT)
                if lines:
                    blocks.append(f"rank {rank}'s last stderr lines:\n" + "\n".join(f"    {x}" for x in lines))
        return "\n".join(blocks)

    def watch(self, on_death: Callable[[list[str]], None]) -> None:
        """Call ``on_death(lines)`` from a daemon thread as soon as any worker exits unasked (at once if one has)."""
        self._on_death = on_death
        failures = self.failures()
        if failures and not self._stopping:
            on_death(failures)

    def expect_exit(self) -> None:
        """From now on an exiting worker is being stopped, not dying."""
        self._stopping = True

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the workers to exit, then kill those left; reap all."""
        self._stopping = True
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.kill()

    def kill(self) -> None:
        self._stopping = True
        for process in self.processes:
            if process.returncode is None:
                try:
                    process.kill()
                except ProcessLookupError:  # exited a moment ago, not reaped yet
                    pass
        for process in self.processes:
            process.wait()
