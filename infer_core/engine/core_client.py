"""CoreClient: the engine-core process as the server's event loop sees it.

It starts the process, writes commands through an ``Outbox`` thread, and reads the core's
messages on a reader thread of its own, which hands each batch of what has arrived to the event
loop (``call_soon_threadsafe``). The connection's file descriptor is never given to the event loop:
an event loop built on libuv (uvloop) puts a descriptor it watches in non-blocking mode, and a
message larger than the socket's buffer (``CoreStarted`` carries the pickled tokenizer) would then
be cut short mid-read on this side, and the ``Outbox``'s writes fail the same way. The reader's end
of file is the core's exit: the thread then waits briefly for the process and reports its exit code
through the loop, after every message the core sent before it went.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
import threading
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
MAX_MESSAGES_PER_BATCH = 64  # handed to the event loop in one callback, so it serves others between batches
EXIT_JOIN_S = 5.0  # after the core closed its end, how long its process may take to end before its exit is reported
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
        self._reader: threading.Thread | None = None

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
        self._reader = threading.Thread(target=self._read, args=(loop,), name="infer-frontend-reader",
                                        daemon=True)
        self._reader.start()
        # An exit that skips the server's shutdown (uvicorn cannot bind its port, say) must not leave
        # multiprocessing's exit handler joining a core that waits for commands: stop it first.
        atexit.register(self.stop, EXIT_STOP_TIMEOUT_S)

    def send(self, message: Any) -> None:
        """Queue a command for the core; never blocks."""
        if self._outbox is not None:
            self._outbox.put(message)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """The reader thread: blocking reads until the core's end closes, then its exit code."""
        conn = self._conn
        ended = False
        while not ended:
            batch: list[Any] = []
            try:
                batch.append(conn.recv())
                while len(batch) < MAX_MESSAGES_PER_BATCH and conn.poll():
                    batch.append(conn.recv())
            except (EOFError, OSError):  # the core closed its end: it is exiting
                ended = True
            except Exception:  # read whole but not unpickled here: dropped, the next one is intact
                logger.exception("a message from the engine core could not be unpickled")
            if batch and not _call_soon(loop, self._deliver, batch):
                return
        self.process.join(EXIT_JOIN_S)
        _call_soon(loop, self._on_exit, self.process.exitcode)

    def _deliver(self, batch: list[Any]) -> None:
        on_message = self._on_message
        for message in batch:
            on_message(message)

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


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> bool:
    """Run ``callback(*args)`` on ``loop`` from another thread; False once the loop is closed."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop closed (the server ended without stopping its core first)
        return False
    return True
