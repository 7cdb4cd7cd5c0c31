"""TokenizerPool: threads that tokenize and render chat templates off the event loop.

A prompt that takes seconds to tokenize holds one thread while the others serve the requests
behind it (the tokenizer's Rust code lets go of the GIL while it works). The threads keep the
process's priority: a prompt too long for the context is refused by its length before it gets
here (server/prompt_bound.py), and a lowered priority would make every short prompt and chat
template wait on whatever else the machine runs. The
threads are daemons: a shutdown does not wait for a tokenization that no client will read
(concurrent.futures' pool would hold the process's exit until it ends). A job whose caller has
gone (cancelled) is skipped.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = object()


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
