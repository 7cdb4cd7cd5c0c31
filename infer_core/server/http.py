"""HTTP plumbing the controllers share: the API-key guard, body parsing, disconnect detection."""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from typing import Any, TypeVar

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from pydantic import BaseModel, ValidationError

from infer_core.server.errors import OpenAIError, bad_request

Body = TypeVar("Body", bound=BaseModel)


def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard: with ``api_key`` set, the request must carry ``Authorization: Bearer <key>``."""
    expected = connection.app.state.server.settings.api_key
    if not expected:
        return
    scheme, _, given = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise OpenAIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' with the server's "
                               "--api-key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The JSON body validated as ``model``; 400 naming the field, 413 when too large."""
    raw = await request.body()  # Litestar enforces request_max_body_size (413)
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise bad_request(f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


# pydantic names the union member it tried in ``loc`` ("str", "list[int]", "function-after[...]"): not fields
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|list|dict|json-or-python|constrained-\w+|.*\[.*\])$")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def validation_error(error: ValidationError) -> OpenAIError:
    first = error.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if not _UNION_TAG.match(str(p))]
    param = ".".join(loc) or None
    value = first.get("input")
    shown = json.dumps(value)[:80] if isinstance(value, str | int | float | bool | type(None)) else type(value).__name__
    message = f"{param}: {first.get('msg')} (got {shown})" if param else str(first.get("msg"))
    return bad_request(message, param=param)


async def wait_for_disconnect(request: Request) -> None:
    """Return when the client goes away (the body must have been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


DISCONNECTED = object()


async def unless_disconnected(request: Request, work: Any) -> Any:
    """Await ``work``; if the client disconnects first, cancel it (its cleanup runs) and return DISCONNECTED."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # let its cleanup (aborts) run now
        return DISCONNECTED
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
