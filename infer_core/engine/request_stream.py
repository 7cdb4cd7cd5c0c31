"""One request's outputs on the asyncio side, fed from the engine thread.

The engine thread never touches an ``asyncio.Queue`` itself: it hands a batch of (stream, item)
pairs to ``deliver`` through the event loop's ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from infer_core.outputs import RequestOutput


class RequestStream:
    """The outputs of one request, in order; iteration ends after the finished output."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            yield item


def deliver(deliveries: list[tuple[RequestStream, Any]]) -> None:
    """Put each item (an output, or the error that ends the stream) on its stream; on the event loop."""
    for stream, item in deliveries:
        stream.queue.put_nowait(item)
