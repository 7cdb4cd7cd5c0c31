"""CoreClient: the engine-core process as the server's event loop sees it.

It starts the process, writes commands through an ``Outbox`` thread, and reads the core's
messages on the event loop: a reader callback on the connection takes whatever has arrived (the
core writes each message whole, so a read never waits for the rest of one), and a second one on
the process's sentinel reports its exit, after reading what it sent last (its ``CoreFailed``).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
from collections.abc import Callable
from typing import Any

from infer_core.engine.core_messages import SHUTDOWN
from infer_core.engine.core_process import run_engine_core
from infer_core.engine.outbox import Outbox
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)

# How the core's process starts: never fork this process (threads run here, and a forked CUDA
# context is unusable), but a fresh interpreter forked from multiprocessing's fork server, which has
# already imported the core's modules: a process that starts several cores (tests, benchmarks)
# pays for importing torch once, not per core. Spawn where there is no fork server (Windows).
CORE_MODULE = "infer_core.engine.core_process"
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
MAX_MESSAGES_PER_READ = 64  # then the event loop serves others before reading on
EXIT_STOP_TIMEOUT_S = 10.0  # at interpreter exit, how long the core may take to stop before it is ended


def _log_setup() -> tuple[int | None, str | None]:
    """The root logger's level and format, for the core process to log as this one does (None: as Python's default)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if handler.formatter is not None and handler.formatter._fmt:
            return root.level, handler.formatter._fmt
    return None, None


class CoreClient:
    def __init__(self, settings: EngineSettings, on_message: Callable[[Any], None],
                 on_exit: Callable[[int | None], None]) -> None:
        self.settings = settings
        self._on_message = on_message
        self._on_exit = on_exit
        self.process: multiprocessing.process.BaseProcess | None = None
        self._conn = None
        self._outbox: Outbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        context = multiprocessing.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            context.set_forkserver_preload([CORE_MODULE])
        self._conn, child_conn = context.Pipe(duplex=True)
        # not a daemon: a tensor-parallel core starts worker processes of its own
        self.process = context.Process(target=run_engine_core, name="infer-engine-core",
                                       args=(self.settings, child_conn, *_log_setup()))
        self.process.start()
        child_conn.close()  # the core's end lives in the core: its exit is then an end of file here
        logger.info("engine core process %d started", self.process.pid)
        self._outbox = Outbox(self._conn, "infer-frontend-outbox")
        self._loop = loop
        loop.add_reader(self._conn.fileno(), self._read)
        loop.add_reader(self.process.sentinel, self._exited)
        self._reading = True
        # An exit that skips the server's shutdown (uvicorn cannot bind its port, say) must not leave
        # multiprocessing's exit handler joining a core that waits for commands: stop it first.
        atexit.register(self.stop, EXIT_STOP_TIMEOUT_S)

    def send(self, message: Any) -> None:
        """Queue a command for the core; never blocks."""
        if self._outbox is not None:
            self._outbox.put(message)

    def _read(self) -> None:
        conn = self._conn
        for _ in range(MAX_MESSAGES_PER_READ):
            try:
                if not conn.poll():
                    return
                message = conn.recv()
            except (EOFError, OSError):
                self._stop_reading()  # the core closed its end; its exit follows (the sentinel)
                return
            self._on_message(message)

    def _exited(self) -> None:
        while self._reading:  # what it sent before it went
            try:
                if not self._conn.poll():
                    break
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            self._on_message(message)
        self._stop_reading()
        if self._loop is not None:
            self._loop.remove_reader(self.process.sentinel)
        self.process.join(1)
        self._on_exit(self.process.exitcode)

    def _stop_reading(self) -> None:
        if self._reading and self._loop is not None:
            self._reading = False
            self._loop.remove_reader(self._conn.fileno())

    def stop(self, timeout: float) -> None:
        """Ask the core to stop, wait up to ``timeout`` s, then end it; safe from any thread."""
        if self.process is None:
            return
        atexit.unregister(self.stop)
        if self._outbox is not None:
            self._outbox.put(SHUTDOWN)
            self._outbox.close(timeout)
        self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("the engine core did not stop within %.0f s: terminating it", timeout)
            self.process.terminate()
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
