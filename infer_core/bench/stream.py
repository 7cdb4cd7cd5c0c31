"""One streamed OpenAI request, timed from the client's side: TTFT, inter-token gaps, E2E.

Works for ``/v1/completions`` (``choices[0].text``) and ``/v1/chat/completions``
(``choices[0].delta.content``); an error, as an HTTP status or as an error envelope inside the
stream, becomes a failed record with the server's message rather than an exception.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

_MAX_ERROR_CHARS = 500


@dataclass(slots=True)
class RequestRecord:
    """What one request measured; times are seconds, ``start`` is ``time.perf_counter()``."""

    start: float
    is_ok: bool = False
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None for a single-token answer."""
        if (
            not self.is_ok
            or self.ttft is None
            or self.e2e is None
            or self.output_tokens < 2
        ):
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class EventTimer:
    """Times a stream's events line by line: TTFT at the first event with text, a gap at each later one."""

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.last_content: float | None = None
        self.num_content_chunks = 0
        self.usage: dict[str, Any] | None = None
        self.done = False

    def line(self, line: str, now: float) -> str | None:
        """Take one line (``done`` turns True at ``[DONE]``); the failure it shows, else None.

        Raises json.JSONDecodeError for a data line that is not JSON."""
        event = _parse_sse_line(line)
        if event is None:
            return None
        if event == "[DONE]":
            self.done = True
            return None
        if not isinstance(event, dict):
            return f"unexpected stream data: {line[:200]}"
        if _is_error_event(event):
            return f"error in stream: {_envelope_message(event)}"
        if event.get("usage"):
            self.usage = event["usage"]
        if _content(event):
            record = self.record
            if self.last_content is None:
                record.ttft = now - record.start
            else:
                record.itl.append(now - self.last_content)
            self.last_content = now
            self.num_content_chunks += 1
        return None

    def finish(self) -> RequestRecord:
        """The record once the stream ended well: tokens from the usage event, else one per event with text."""
        record = self.record
        record.e2e = time.perf_counter() - record.start
        usage = self.usage
        if usage is not None:
            record.output_tokens = int(usage.get("completion_tokens") or 0)
            if usage.get("prompt_tokens") is not None:
                record.prompt_tokens = int(usage["prompt_tokens"])
        else:
            record.output_tokens = self.num_content_chunks
        if record.ttft is None:
            return _failed(
                record,
                f"the stream ended without generated text ({record.output_tokens} output tokens)",
            )
        record.is_ok = True
        return record


async def send_streaming_request(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
) -> RequestRecord:
    """POST ``payload`` with ``stream: true`` and time every chunk that carries text."""
    import httpx

    record = RequestRecord(start=time.perf_counter())
    timer = EventTimer(record)
    try:
        async with client.stream(
            "POST", url, json=payload, headers=headers
        ) as response:
            if response.status_code != 200:
                body = await response.aread()
                return _failed(
                    record, f"HTTP {response.status_code}: {error_message(body)}"
                )
            async for line in response.aiter_lines():
                failure = timer.line(line, time.perf_counter())
                if failure is not None:
                    return _failed(record, failure)
                if timer.done:
                    break
    except httpx.HTTPError as e:
        return _failed(record, f"{type(e).__name__}: {e or 'no details'}")
    except json.JSONDecodeError as e:
        return _failed(record, f"malformed stream data (not JSON): {e.msg}")
    return timer.finish()


def failed(record: RequestRecord, error: str) -> RequestRecord:
    """``record`` as a failure with ``error``."""
    return _failed(record, error)


async def list_models(
    client: httpx.AsyncClient, url: str, headers: dict[str, str]
) -> list[str]:
    """The model ids ``GET /v1/models`` reports, in its order."""
    response = await client.get(url, headers=headers)
    if response.status_code != 200:
        raise ValueError(
            f"HTTP {response.status_code}: {error_message(response.content)}"
        )
    data = response.json().get("data") or []
    return [m["id"] for m in data if isinstance(m, dict) and m.get("id")]


def error_message(body: bytes) -> str:
    """The message of an OpenAI error envelope, else the start of the body."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:_MAX_ERROR_CHARS] or "(empty body)"
    if isinstance(parsed, dict):
        return _envelope_message(parsed)
    return text.strip()[:_MAX_ERROR_CHARS]


def _envelope_message(event: dict[str, Any]) -> str:
    error = event.get("error", event)
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail")
        if message:
            return str(message)[:_MAX_ERROR_CHARS]
    elif error:
        return str(error)[:_MAX_ERROR_CHARS]
    return json.dumps(event)[:_MAX_ERROR_CHARS]


def _parse_sse_line(line: str) -> Any:
    """The JSON of a ``data:`` line, ``"[DONE]"``, or None for comments and other fields."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data:
        return None
    if data == "[DONE]":
        return data
    return json.loads(data)


def _is_error_event(event: dict[str, Any]) -> bool:
    return "error" in event or event.get("object") == "error"


def _content(event: dict[str, Any]) -> str:
    """Generated text of the first choice: completions ``text`` or chat ``delta`` content."""
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return choice["text"] or ""
    delta = choice.get("delta") or {}
    return (
        delta.get("content")
        or delta.get("reasoning_content")
        or delta.get("reasoning")
        or ""
    )


def _failed(record: RequestRecord, error: str) -> RequestRecord:
    record.is_ok = False
    record.error = error
    record.e2e = time.perf_counter() - record.start
    return record
