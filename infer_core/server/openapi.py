"""The OpenAPI document, at ``/openapi.json`` (vLLM's path) and ``/docs/openapi.json`` (the Swagger UI at ``/docs``).

Litestar builds the paths and operations from the handlers' types (``data: ChatCompletionRequest``,
``-> ModelList``, ``responses=``). The component schemas come from the models' own generators:
pydantic's for requests and msgspec's for responses, because Litestar's drops constraints (a
``ge=0`` is lost, being falsy) and a schema that allows more than the server accepts is not the
truth. Then what only the running server knows is filled in: the token-id range of the loaded
model, the served model's name as an example, the bearer scheme when ``--api-key`` is set, and the
``text/event-stream`` form of the streaming routes.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from litestar import Request, get
from litestar.openapi import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from pydantic.json_schema import models_json_schema

from infer_core.server import response_schemas as out
from infer_core.server.request_types import TOKEN_ID_MARK
from infer_core.server.schemas import (
    PRIORITY_MARK,
    TOKEN_KEYS_MARK,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

REF = "#/components/schemas/{name}"
REQUESTS = (ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest)
RESPONSES = (out.ChatCompletion, out.ChatCompletionChunk, out.Completion, out.CompletionChunk, out.ModelList,
             out.TokenizeResponse, out.DetokenizeResponse, out.Health, out.PluginsReport, out.ErrorResponse)
STREAMS = {"/v1/chat/completions": "ChatCompletionChunk", "/v1/completions": "CompletionChunk"}
PUBLIC = ("/health", "/metrics")  # the routes --api-key does not guard

_ERRORS = {
    400: "the body or a field is invalid (param names it), or the prompt does not fit the context "
         "(code context_length_exceeded)",
    404: "no such model (code model_not_found)",
    413: "the body is larger than --max-request-bytes",
    415: "the body is not declared as JSON (code unsupported_media_type)",
    503: "the engine is loading, draining or dead, or too many requests wait (with Retry-After)",
}


def documented(success: type | None = None, description: str = "", *errors: int) -> dict[int, ResponseSpec]:
    """``responses=`` for a route: its 200 body and its error statuses, each OpenAI's envelope."""
    specs = {status: ResponseSpec(out.ErrorResponse, description=_ERRORS[status], generate_examples=False)
             for status in errors}
    if success is not None:
        specs[200] = ResponseSpec(success, description=description, generate_examples=False)
    return specs


class _DocumentJSON(JsonRenderPlugin):
    """``/docs/openapi.json``, which the Swagger UI reads: the same document as ``/openapi.json``."""

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        return request.app.state.openapi.encoded(request)


def openapi_config(version: str) -> OpenAPIConfig:
    return OpenAPIConfig(title="infer", version=version, path="/docs", create_examples=False,
                         description="OpenAI-compatible API of infer (see docs/serving.md)",
                         render_plugins=[SwaggerRenderPlugin(path="/"), _DocumentJSON(path="/openapi.json")])


@get("/openapi.json", include_in_schema=False, media_type="application/json", sync_to_thread=False)
def openapi_json(request: Request) -> bytes:
    return request.app.state.openapi.encoded(request)


class OpenAPIDocument:
    """The document of one app, built on first request and again once the model is loaded."""

    def __init__(self, api_key_required: bool) -> None:
        self.api_key_required = api_key_required
        self._cached: tuple[bool, bytes] | None = None

    def encoded(self, request: Request) -> bytes:
        server = request.app.state.server
        vocab_size = len(server.tokenizer) if server.tokenizer is not None else None
        loaded = vocab_size is not None
        if self._cached is None or self._cached[0] != loaded:
            document = build_document(request.app.openapi_schema.to_schema(), self.api_key_required,
                                      server.model_name, vocab_size, server.settings.scheduler == "priority")
            self._cached = (loaded, msgspec.json.encode(document))
        return self._cached[1]


def component_schemas() -> dict[str, Any]:
    """Every request and response schema, as pydantic and msgspec write them."""
    _, requests = models_json_schema([(model, "validation") for model in REQUESTS], ref_template=REF.replace(
        "{name}", "{model}"))
    _, responses = msgspec.json.schema_components(RESPONSES, ref_template=REF)
    return {**requests.get("$defs", {}), **responses}


def build_document(litestar_document: dict[str, Any], api_key_required: bool, model_name: str,
                   vocab_size: int | None, serves_priority: bool = True) -> dict[str, Any]:
    document = copy.deepcopy(litestar_document)
    schemas = component_schemas()
    document.setdefault("components", {})["schemas"] = schemas
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            if path in STREAMS:
                operation["responses"]["200"]["content"]["text/event-stream"] = _event_stream(STREAMS[path])
            if api_key_required and path not in PUBLIC:
                operation["security"] = [{"bearer": []}]
                operation["responses"]["401"] = {
                    "description": "no or wrong 'Authorization: Bearer <key>' (code invalid_api_key)",
                    "content": {"application/json": {"schema": {"$ref": REF.format(name="ErrorResponse")}}}}
    if api_key_required:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for name in ("ChatCompletionRequest", "CompletionRequest", "TokenizeRequest", "DetokenizeRequest"):
        model_property = schemas[name]["properties"].get("model")
        if model_property is not None:
            model_property["examples"] = [model_name]
    _fill_server_limits(schemas, vocab_size, serves_priority)
    return document


def _event_stream(chunk: str) -> dict[str, Any]:
    """The stream, one server-sent event at a time (OpenAPI 3.2's ``itemSchema``, which 3.1 tools read from ``schema``).

    Each event is ``{"event": "message", "data": ...}``: ``data`` is a chunk as JSON, an error envelope
    (an error after the status was sent), or the last event's ``[DONE]``.
    """
    payload = {"anyOf": [{"$ref": REF.format(name=chunk)}, {"$ref": REF.format(name="ErrorResponse")}]}
    event = {"type": "object", "required": ["data"],
             "description": f"server-sent events: one `data: <{chunk}>` per step (an error mid-stream: "
                            f"`data: <ErrorResponse>`), then `data: [DONE]`",
             "properties": {"event": {"const": "message"},
                            "data": {"type": "string", "if": {"const": "[DONE]"}, "then": True,
                                     "else": {"contentMediaType": "application/json", "contentSchema": payload}}}}
    return {"schema": event}


def _fill_server_limits(node: Any, vocab_size: int | None, serves_priority: bool) -> None:
    """Token-id fields get the loaded vocabulary's range (logit_bias keys as a pattern); ``priority`` is 0
    only unless the priority scheduler runs."""
    if isinstance(node, dict):
        if node.pop(TOKEN_ID_MARK, None) and vocab_size:
            node["maximum"] = vocab_size - 1
        if node.pop(TOKEN_KEYS_MARK, None):  # pydantic writes the keys' pattern as patternProperties
            (pattern, values), = node.pop("patternProperties").items()
            if vocab_size:
                pattern = f"^({integers_up_to(vocab_size - 1)})$"
            node["propertyNames"] = {"pattern": pattern}
            node["additionalProperties"] = values
        if node.pop(PRIORITY_MARK, None) and not serves_priority:
            node["const"] = 0
            node["description"] = "0 only: this server runs another scheduler than priority"
        for value in node.values():
            _fill_server_limits(value, vocab_size, serves_priority)
    elif isinstance(node, list):
        for value in node:
            _fill_server_limits(value, vocab_size, serves_priority)


def integers_up_to(largest: int) -> str:
    """A regular expression (no anchors) of the decimal integers 0..``largest``, without leading zeros."""
    top = str(largest)
    width = len(top)
    alternatives = ["[0-9]"] if width > 1 else []  # the shorter numbers
    if width > 2:
        alternatives.append(f"[1-9][0-9]{{1,{width - 2}}}")
    for i, digit in enumerate(top):  # as long as ``top``: a prefix of it, then a smaller digit, then any digits
        low = 1 if i == 0 and width > 1 else 0
        if int(digit) > low:
            alternatives.append(f"{top[:i]}[{low}-{int(digit) - 1}]" + (f"[0-9]{{{width - i - 1}}}"
                                                                          if i < width - 1 else ""))
    alternatives.append(top)
    return "|".join(alternatives)
