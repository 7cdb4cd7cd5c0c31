"""Offered load: a fixed number of requests in flight, or Poisson arrivals at a request rate."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infer_core.bench.stream import RequestRecord


@dataclass(slots=True, frozen=True)
class LoadPoint:
    """One point of a sweep: at most ``concurrency`` in flight, arrivals at ``request_rate``/s.

    ``concurrency=None`` means no cap; ``request_rate=inf`` sends every request at once.
    """

    concurrency: int | None = None
    request_rate: float = math.inf

    @property
    def name(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        if math.isinf(self.request_rate):
            return "request rate inf (all at once)"
        return f"request rate {self.request_rate:g}/s"


@dataclass(slots=True)
class LoadRun:
    """Records of one load point, in send order, and the client-side facts about the run."""

    records: list[RequestRecord]
    duration_s: float
    max_in_flight: int


def arrival_rng(seed: int, load_index: int) -> random.Random:
    """The generator of one load point's arrival times, so a sweep's points are independent."""
    return random.Random(f"arrivals-{seed}-{load_index}")


def arrival_offsets(
    num_requests: int, request_rate: float, rng: random.Random
) -> list[float]:
    """Send times (seconds from the start) of a Poisson process: exponential gaps of mean 1/rate.

    The first request goes at 0; an infinite rate sends every request at 0.
    """
    if math.isinf(request_rate):
        return [0.0] * num_requests
    offsets, now = [], 0.0
    for i in range(num_requests):
        if i:
            now += rng.expovariate(request_rate)
        offsets.append(now)
    return offsets


async def run_load(
    send: Callable[[Any], Awaitable[RequestRecord]],
    payloads: Sequence[Any],
    load: LoadPoint,
    rng: random.Random,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> LoadRun:
    """Send every payload with ``send`` under ``load``; the clock runs from first send to last reply."""
    limit = (
        asyncio.Semaphore(load.concurrency) if load.concurrency is not None else None
    )
    in_flight = 0
    max_in_flight = 0

    async def one(payload: Any) -> RequestRecord:
        nonlocal in_flight, max_in_flight
        if limit is not None:
            await limit.acquire()
        in_flight += 1
        max_in_flight = max(max_in_flight, in_flight)
        try:
            record = await send(payload)
        finally:
            in_flight -= 1
            if limit is not None:
                limit.release()
        if on_done is not None:
            on_done(record)
        return record

    offsets = arrival_offsets(len(payloads), load.request_rate, rng)
    start = time.perf_counter()
    tasks = []
    for payload, offset in zip(payloads, offsets, strict=True):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(payload)))
    records = await asyncio.gather(*tasks)
    return LoadRun(
        records=list(records),
        duration_s=time.perf_counter() - start,
        max_in_flight=max_in_flight,
    )
