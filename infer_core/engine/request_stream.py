"""One request's outputs on the asyncio side, as the engine's steps produce them.

A reader that falls behind (a slow client, a busy event loop) does not make the outputs pile up:
consecutive outputs not yet read are merged into one, whose deltas are the sum of theirs (vLLM v1
does the same), so the work of serving a stream follows what its client can take, not the step rate.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

from infer_core.outputs import CompletionOutput, RequestOutput


def merge_outputs(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """``later`` with the deltas of ``earlier`` in front of its own (outputs are cumulative otherwise)."""
    before = {c.index: c for c in earlier.outputs}
    merged = []
    for c in later.outputs:
        prior = before.get(c.index)
        if prior is not None and (prior.delta_text or prior.delta_token_ids):
            c = CompletionOutput(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason, c.logprobs,
                                 prior.delta_text + c.delta_text, prior.delta_token_ids + c.delta_token_ids)
        merged.append(c)
    return RequestOutput(later.request_id, later.prompt, later.prompt_token_ids, merged, later.finished,
                         later.num_cached_tokens, later.metrics, later.prompt_logprobs)


class RequestStream:
    """The outputs of one request, in order; iteration ends after the finished output (or raises
    the error that ended it)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._items: collections.deque[RequestOutput | BaseException] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self.finished = False

    def put(self, item: RequestOutput | BaseException) -> None:
        """Add an output (merged into one not yet read) or the error that ends the stream; on the event loop."""
        items = self._items
        if items and isinstance(item, RequestOutput) and isinstance(items[-1], RequestOutput):
            items[-1] = merge_outputs(items[-1], item)
        else:
            items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while (output := await self.next()) is not None:
            yield output

    async def next(self) -> RequestOutput | None:
        """The next output (those not read yet merged into one), None after the finished one; raises the error
        that ended the stream. A plain coroutine that returns at once while outputs wait: a streamed response
        reads every output through it, where each async generator in between costs a resumption per output."""
        if self.finished:
            return None
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item
