"""Waiting for a server that is still starting: not listening yet, or loading its model.

Ready means ``GET /health`` does not answer 5xx (servers without the route answer 404, which is
fine) and ``GET /v1/models`` answers 200. vLLM, SGLang and infer all answer /health.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from infer_core.bench.stream import error_message

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

_POLL_S = 0.5


class NotReadyError(RuntimeError):
    """The server did not become ready in time; the message says what it answered last."""


async def wait_until_ready(
    client: httpx.AsyncClient,
    base: str,
    headers: dict[str, str],
    timeout_s: float,
    check_alive: Callable[[], None] | None = None,
) -> None:
    """Poll ``base`` until it is ready or ``timeout_s`` has passed; ``check_alive`` (a server this
    process started) raises when the server is gone, so a failed start is reported at once."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    logged = False
    while True:
        if check_alive is not None:
            check_alive()
        last = await _not_ready_reason(client, base, headers)
        if last is None:
            return
        if time.monotonic() >= deadline:
            raise NotReadyError(
                f"{base} not ready after {timeout_s:g} s; it last said: {last}"
            )
        if not logged:
            logger.info("waiting up to %g s for %s: %s", timeout_s, base, last)
            logged = True
        await asyncio.sleep(_POLL_S)


async def _not_ready_reason(
    client: httpx.AsyncClient, base: str, headers: dict[str, str]
) -> str | None:
    import httpx

    try:
        health = await client.get(base + "/health", headers=headers)
        if health.status_code >= 500:
            return (
                f"/health: HTTP {health.status_code}: {error_message(health.content)}"
            )
        models = await client.get(base + "/v1/models", headers=headers)
        if models.status_code != 200:
            return f"/v1/models: HTTP {models.status_code}: {error_message(models.content)}"
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e or 'no details'}"
    return None
