"""Outbox: messages written to a ``multiprocessing`` connection by a thread of their own.

A pipe holds only so much; whoever writes to a full one waits for the other side to read. Neither
the engine core's step loop nor the server's event loop may wait on the other, so each side
pickles a message where it is made (a snapshot of that moment) and hands the bytes to this thread,
which does the writing. A peer that went away ends the thread quietly: the reading side notices
(end of file, the process's exit) and says why.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
from multiprocessing.connection import Connection
from typing import Any

logger = logging.getLogger(__name__)

_CLOSE = object()


class Outbox:
    def __init__(self, conn: Connection, name: str) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[bytes | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.is_broken = False  # the peer is gone: later messages are dropped

    def put(self, message: Any) -> None:
        """Queue ``message`` (pickled now); returns at once."""
        self._queue.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued, then stop the thread (waiting up to ``timeout`` s for it)."""
        self._queue.put(_CLOSE)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                return
            if self.is_broken:
                continue
            try:
                self._conn.send_bytes(item)
            except (OSError, ValueError) as e:  # the peer closed its end (or ours was closed)
                logger.debug("connection closed while sending: %s", e)
                self.is_broken = True
