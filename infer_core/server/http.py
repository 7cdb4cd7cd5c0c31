"""HTTP plumbing the controllers share: the API-key guard, the JSON body, disconnect detection."""

from __future__ import annotations

import asyncio
import gc
import hmac
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, TypeVar

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.dto import AbstractDTO
from litestar.handlers import BaseRouteHandler
from litestar.typing import FieldDefinition
from pydantic import BaseModel

from infer_core.server.body import check_content_type, decode_object
from infer_core.server.body_worker import LARGE_BODY, decode_large
from infer_core.server.errors import OpenAIError
from infer_core.server.validation import validate

T = TypeVar("T")
DECODED_BODY = "infer_decoded_body"  # the request's state key of a body decoded by ``decode_large_body``


# The guards are coroutines: Litestar runs a plain function guard on its thread pool, a hop to another thread and
# back for every request.
async def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard: with ``api_key`` set, the request must carry ``Authorization: Bearer <key>``."""
    expected = connection.app.state.server.settings.api_key
    if not expected:
        return
    scheme, _, given = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise OpenAIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' with the server's "
                               "--api-key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class JSONBody(AbstractDTO[T], Generic[T]):
    """How a handler's ``data: SomeRequest`` is read: ``body.decode_object`` then ``validation.validate``.

    A DTO is Litestar's hook for both ends of a typed body: it decodes the request (here with the
    checks Litestar's own decoder lacks: its deep-nesting and big-number failures are 500s) and it
    describes the body in the OpenAPI document (the pydantic model, as a ``$ref``).
    """

    _models: ClassVar[dict[str, type[BaseModel]]] = {}

    @classmethod
    def create_for_field_definition(cls, field_definition: FieldDefinition, handler_id: str,
                                    backend_cls: Any = None) -> None:
        cls._models[handler_id] = field_definition.annotation

    @classmethod
    def create_openapi_schema(cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any) -> Any:
        return schema_creator.for_field_definition(FieldDefinition.from_annotation(cls._models[handler_id]))

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Iterator[Any]:
        return iter(())

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        return False

    def decode_bytes(self, value: bytes) -> Any:
        connection = self.asgi_connection
        decoded = connection.state.get(DECODED_BODY)
        if decoded is not None:  # a large body, already decoded off the event loop
            return decoded
        check_content_type(connection.headers.get("content-type"))
        model = self._models[connection.route_handler.handler_id]
        with _collector_paused(len(value) > LARGE_BODY):
            return validate(model, decode_object(value))


async def decode_large_body(request: Request) -> None:
    """``before_request``: a large body of a route that reads a ``JSONBody`` is decoded and validated in the
    body worker's process (``body_worker``) while the event loop serves others; the DTO then hands it over."""
    model = JSONBody._models.get(request.route_handler.handler_id)
    if model is None:
        return
    body = await request.body()  # kept by the request: the DTO's read of it costs nothing
    if len(body) > LARGE_BODY:
        check_content_type(request.headers.get("content-type"))
        request.state[DECODED_BODY] = await decode_large(model, body)


@contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Decoding millions of small lists (token ids) spends most of its time in GC passes that free nothing."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def require_ready(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """503 while the engine loads, drains or is dead: before the body is read, so no body's fault comes first."""
    connection.app.state.server.require_ready()


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
