"""TokenizerPool: threads that tokenize and render chat templates off the event loop.

A prompt that takes seconds to tokenize holds one thread while the others serve the requests
behind it (the tokenizer's Rust code lets go of the GIL while it works). On Linux each thread
lowers its own CPU priority (``NICE_INCREMENT``): where the model runs on the same CPU cores, a
long tokenization then takes what the engine core's steps leave, not half of the cores. The
threads are daemons: a shutdown does not wait for a tokenization that no client will read
(concurrent.futures' pool would hold the process's exit until it ends). A job whose caller has
gone (cancelled) is skipped.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = object()
NICE_INCREMENT = 10  # added to a tokenizer thread's nice value (the kernel caps it at 19)


class TokenizerPool:
    def __init__(self, num_threads: int, name: str = "infer-tokenizer") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(num_threads)]
        for thread in self._threads:
            thread.start()

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on a pool thread; its exception is raised here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, work, args))
        return await future

    def _work(self) -> None:
        _lower_priority()
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            loop, future, work, args = job
            if future.cancelled():
                continue
            try:
                result = work(*args)
            except BaseException as e:  # noqa: BLE001 - the caller's to handle
                _settle(loop, future, None, e)
            else:
                _settle(loop, future, result, None)

    def shutdown(self) -> None:
        """Let the threads end after their current job (no wait)."""
        for _ in self._threads:
            self._jobs.put(_STOP)


def _lower_priority() -> None:
    """This thread's nice value up by NICE_INCREMENT (Linux: per thread; elsewhere, or refused, left alone)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE_INCREMENT))
    except (AttributeError, OSError):
        pass


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    def settle() -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody waits for this result
        pass
