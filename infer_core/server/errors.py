"""Every failure as OpenAI's error envelope: ``{"error": {"message", "type", "param", "code"}}``.

Clients (the openai package, LangChain, Open WebUI) parse this shape to show the user what went
wrong, so the server answers with it for its own errors and for Litestar's (404 route, 405, 413,
500) alike.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from infer_core.errors import EngineDeadError

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
          503: "service_unavailable_error"}


class OpenAIError(Exception):
    """An error answered with the envelope, a status and optional headers (``Retry-After``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def envelope(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: OpenAIError) -> Response:
    return Response(envelope(error.status, error.message, error.param, error.code), status_code=error.status,
                    headers=error.headers, media_type="application/json")


def _openai_error_handler(_: Request, exc: OpenAIError) -> Response:
    return error_response(exc)


def _http_exception_handler(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    message = exc.detail or "error"
    if status == 413:
        limit = getattr(request.app, "request_max_body_size", None)
        accepted = f" ({limit:,} bytes)" if isinstance(limit, int) else ""
        message = (f"the request body is larger than the server accepts{accepted}; raise --max-request-bytes or "
                   f"send less")
    elif status == 404:
        message = f"{exc.detail}: no such endpoint (the API: /openapi.json, /docs)" if exc.detail \
            else "no such endpoint (the API: /openapi.json, /docs)"
    elif isinstance(exc, ValidationException) and _is_missing_body(exc):
        message = "the body is empty: send the request's fields as a JSON object with 'Content-Type: " \
                  "application/json' (the API: /openapi.json)"
    return error_response(OpenAIError(status, message, headers=getattr(exc, "headers", None) or None))


def _is_missing_body(exc: ValidationException) -> bool:
    """Litestar's own check, for a typed ``data`` parameter and an empty body: the only one it makes here."""
    return isinstance(exc.extra, list) and any(isinstance(e, dict) and e.get("key") == "data" for e in exc.extra)


def _engine_dead_handler(_: Request, exc: EngineDeadError) -> Response:
    return error_response(OpenAIError(503, str(exc), headers={"Retry-After": "5"}))


def _internal_error_handler(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error serving %s %s", request.method, request.url.path)
    return error_response(OpenAIError(500, f"internal server error ({type(exc).__name__}); see the server log"))


EXCEPTION_HANDLERS = {OpenAIError: _openai_error_handler, HTTPException: _http_exception_handler,
                      EngineDeadError: _engine_dead_handler, Exception: _internal_error_handler}
