"""TokenizerPool: a long job holds one thread, not the jobs behind it; errors reach their caller."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from infer_core.server.tokenizer_pool import TokenizerPool


def test_short_jobs_pass_a_long_one_and_errors_reach_the_caller():
    pool = TokenizerPool(2)
    release = threading.Event()

    def long_job() -> str:
        release.wait(30)
        return "long"

    def failing() -> None:
        raise ValueError("bad prompt")

    async def run():
        long = asyncio.ensure_future(pool.run(long_job))
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        shorts = [await pool.run(lambda i=i: i * i) for i in range(20)]
        took = time.perf_counter() - started
        with pytest.raises(ValueError, match="bad prompt"):
            await pool.run(failing)
        assert not long.done()
        release.set()
        return shorts, took, await long

    shorts, took, long = asyncio.run(run())
    pool.shutdown()
    assert shorts == [i * i for i in range(20)] and long == "long"
    assert took < 5


def test_a_cancelled_job_is_skipped_and_the_threads_do_not_hold_the_exit():
    pool = TokenizerPool(1)
    release = threading.Event()
    ran: list[str] = []

    async def run():
        blocker = asyncio.ensure_future(pool.run(release.wait, 30))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(pool.run(ran.append, "queued"))
        await asyncio.sleep(0.05)
        queued.cancel()
        release.set()
        await blocker
        assert await pool.run(ran.append, "after") is None

    asyncio.run(run())
    assert ran == ["after"]
    assert all(t.daemon for t in pool._threads)
    pool.shutdown()
