"""Large JSON bodies decoded and validated in a process of their own, so the event loop never holds them.

A body of millions of token ids takes seconds to decode (``json.loads``) and validate (pydantic), and
both run in C without letting go of the GIL: in a thread of the server's process they would still
hold every stream and every new request that long. A worker process (started from multiprocessing's
fork server, as the engine core is: this process has threads and is never forked) does both; the
event loop waits for it like any other I/O, and only unpickles the result. Its errors come back as
the 400s they are. Small bodies stay on the loop: for them the round trip costs more than the work.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pydantic import BaseModel

from infer_core.server.body import decode_object
from infer_core.server.errors import OpenAIError
from infer_core.server.validation import validate

logger = logging.getLogger(__name__)

LARGE_BODY = 1 << 20  # bytes above which a body is decoded in the worker process
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None


def _worker_pool() -> ProcessPoolExecutor:
    """One worker per server process, started with the first large body and shared by every app in it."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context(START_METHOD))
        return _pool


def start() -> None:
    """Start the worker now (it imports the request models), so the first large body does not wait for it."""
    _worker_pool().submit(_ready)


def stop() -> None:
    """Stop the worker (the app's lifespan ends); the next app in this process starts another."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _ready() -> None:
    """Nothing: importing this module in the worker is the work."""


def decode_and_validate(model: type[BaseModel], raw: bytes) -> BaseModel | tuple[int, str, str | None, str | None]:
    """In the worker: the validated body, or its error as (status, message, param, code)."""
    gc.disable()  # millions of small objects, none of them garbage: collection passes would free nothing
    try:
        return validate(model, decode_object(raw))
    except OpenAIError as e:
        return e.status, e.message, e.param, e.code
    finally:
        gc.enable()


async def decode_large(model: type[BaseModel], raw: bytes) -> BaseModel:
    """``validate(model, decode_object(raw))`` in the worker process; raises its OpenAIError here.

    A worker that died (out of memory, killed) is replaced for the next body; this one is decoded here.
    """
    global _pool
    loop = asyncio.get_running_loop()
    pool = _worker_pool()
    try:
        result: Any = await loop.run_in_executor(pool, decode_and_validate, model, raw)
    except BrokenProcessPool:
        logger.warning("the body decoding process died: decoding this body on the event loop")
        with _lock:
            if _pool is pool:
                _pool = None
        result = decode_and_validate(model, raw)
    if isinstance(result, tuple):
        status, message, param, code = result
        raise OpenAIError(status, message, param=param, code=code)
    return result
