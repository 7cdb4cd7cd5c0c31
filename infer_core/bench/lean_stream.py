"""The load generator's streamed requests over plain HTTP/1.1 on an asyncio protocol, without httpx.

At tens of thousands of streamed events a second the client must cost less per event than the server
it measures. httpx reads each event through httpcore, anyio (a cancel scope per read) and h11, and
splits lines in Python: on a 2-core CPU that was more CPU per output token than the server's whole
process. Here a protocol collects what the socket holds, and each wake-up decodes every complete
chunk (``Transfer-Encoding: chunked``, ``Content-Length`` or read-to-close bodies) and splits every
complete line at once; each line's events are timed as ``stream.send_streaming_request`` times them.
One connection per request (``Connection: close``). ``http://`` only; others go through httpx.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

from infer_core.bench.stream import EventTimer, RequestRecord, error_message, failed


class _Reader(asyncio.Protocol):
    """What the socket delivered, and a future to wait for more."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self) -> bool:
        """Wait for more bytes; False at end of stream."""
        if self.eof:
            return False
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        return bool(self.buffer) or not self.eof


class _Body:
    """The response body's bytes as they come: chunked, of a given length, or up to the close."""

    def __init__(self, reader: _Reader, headers: dict[str, str]) -> None:
        self.reader = reader
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.remaining = int(length) if length is not None and not self.chunked else None
        self.done = False

    def take(self) -> bytes:
        """Every complete piece of the body now buffered (may be empty)."""
        buffer = self.reader.buffer
        if not self.chunked:
            data = bytes(buffer) if self.remaining is None else bytes(buffer[:self.remaining])
            del buffer[:len(data)]
            if self.remaining is not None:
                self.remaining -= len(data)
                self.done = self.remaining == 0
            return data
        out = bytearray()
        while True:
            end = buffer.find(b"\r\n")
            if end < 0:
                break
            size = int(bytes(buffer[:end]).split(b";")[0], 16)
            if size == 0:
                self.done = True
                break
            if len(buffer) < end + 2 + size + 2:
                break
            out += buffer[end + 2:end + 2 + size]
            del buffer[:end + 2 + size + 2]
        return bytes(out)

    async def next(self) -> bytes | None:
        """The next bytes of the body; None when it has ended."""
        while True:
            data = self.take()
            if data:
                return data
            if self.done or not await self.reader.more():
                if not self.chunked and self.remaining is None:
                    tail = self.take()
                    return tail or None
                return None


async def _read_head(reader: _Reader) -> tuple[int, dict[str, str]]:
    while (end := reader.buffer.find(b"\r\n\r\n")) < 0:
        if not await reader.more():
            raise ConnectionError("the server closed the connection before the response's headers")
    head = bytes(reader.buffer[:end]).decode("latin-1").split("\r\n")
    del reader.buffer[:end + 4]
    status = int(head[0].split()[1])
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def send_streaming_request_lean(url: str, payload: dict[str, Any], headers: dict[str, str],
                                      timeout_s: float) -> RequestRecord:
    """``stream.send_streaming_request`` for an ``http://`` URL, over a connection of its own."""
    record = RequestRecord(start=time.perf_counter())
    parts = urlsplit(url)
    body = json.dumps(payload).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
               f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
               ).encode("latin-1") + body
    loop = asyncio.get_running_loop()
    connection: list[asyncio.Transport] = []

    async def exchange() -> RequestRecord:
        transport, reader = await loop.create_connection(_Reader, parts.hostname, parts.port or 80)
        connection.append(transport)
        transport.write(request)
        status, response_headers = await _read_head(reader)
        stream = _Body(reader, response_headers)
        if status != 200:
            data = bytearray()
            while (piece := await stream.next()) is not None:
                data += piece
            return failed(record, f"HTTP {status}: {error_message(bytes(data))}")
        timer = EventTimer(record)
        async for lines in _lines(stream):
            now = time.perf_counter()
            for line in lines:
                failure = timer.line(line, now)
                if failure is not None:
                    return failed(record, failure)
                if timer.done:
                    return timer.finish()
        return timer.finish()

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except json.JSONDecodeError as e:
        return failed(record, f"malformed stream data (not JSON): {e.msg}")
    except asyncio.TimeoutError:
        return failed(record, f"ReadTimeout: no answer within {timeout_s:g} s")
    except (OSError, ValueError, IndexError) as e:  # refused, reset, or a malformed response
        return failed(record, f"{type(e).__name__}: {e or 'no details'}")
    finally:
        for transport in connection:
            transport.close()


async def _lines(stream: _Body):
    """Lists of complete lines (text), each list what one read of the socket completed."""
    pending = b""
    while (data := await stream.next()) is not None:
        data = pending + data
        cut = data.rfind(b"\n")
        if cut < 0:
            pending = data
            continue
        pending = data[cut + 1:]
        yield [line.rstrip("\r") for line in data[:cut].decode("utf-8").split("\n")]
    if pending:
        yield [pending.decode("utf-8").rstrip("\r")]
