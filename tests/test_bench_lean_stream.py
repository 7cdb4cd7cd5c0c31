"""The benchmark's own HTTP/1.1 reader: chunked bodies cut anywhere, lines split across reads."""

from __future__ import annotations

import asyncio

import pytest

from infer_core.bench.lean_stream import _Body, _lines, _read_head, _Reader


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def _feed_and_read(raw: bytes, cut: int) -> tuple[int, list[str]]:
    reader = _Reader()

    async def feed():
        for start in range(0, len(raw), cut):
            await asyncio.sleep(0)
            reader.data_received(raw[start:start + cut])
        await asyncio.sleep(0)
        reader.eof_received()

    feeder = asyncio.ensure_future(feed())
    status, headers = await _read_head(reader)
    lines = [line async for batch in _lines(_Body(reader, headers)) for line in batch]
    await feeder
    return status, lines


EVENTS = [b'data: {"choices": [{"text": "a"}]}\n\n', b'data: {"choices": [{"text": "\xc3\xa9"}]}\n\n', b"data: [DONE]\n\n"]


@pytest.mark.parametrize("cut", [1, 3, 7, 64, 10_000])
def test_chunked_lengthed_and_closed_bodies_give_the_same_lines(cut):
    expected = [line.decode() for event in EVENTS for line in event.split(b"\n")[:-1]]
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(*EVENTS)
    body = b"".join(EVENTS)
    lengthed = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    closed = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + body
    for raw in (chunked, lengthed, closed):
        status, lines = asyncio.run(_feed_and_read(raw, cut))
        assert status == 200 and lines == expected


def test_a_connection_closed_before_the_headers_is_an_error():
    with pytest.raises(ConnectionError):
        asyncio.run(_feed_and_read(b"HTTP/1.1 200", 4))
