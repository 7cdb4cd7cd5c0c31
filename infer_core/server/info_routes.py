"""GET /v1/models, /health, /metrics, /v1/plugins; POST /tokenize and /detokenize."""

from __future__ import annotations

from dataclasses import asdict

from litestar import Request, Response, get, post

from infer_core.config import KINDS
from infer_core.engine.engine_state import EngineState
from infer_core.plugins_report import collect_status
from infer_core.server.errors import OpenAIError, bad_request
from infer_core.server.http import parse_body
from infer_core.server.schemas import DetokenizeRequest, TokenizeRequest
from infer_core.server.state import ServerState, render_chat


def _state(request: Request) -> ServerState:
    return request.app.state.server


@get("/v1/models")
async def list_models(request: Request) -> dict:
    state = _state(request)
    card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "infer",
            "root": state.model_name, "parent": None}
    if state.max_model_len:
        card["max_model_len"] = state.max_model_len
    return {"object": "list", "data": [card]}


@get("/health")
async def health(request: Request) -> Response:
    """200 when ready and making progress; 503 while loading, draining, dead or stuck."""
    engine = _state(request).engine
    if engine.is_healthy:
        return Response({"status": "ok"}, status_code=200)
    state = engine.state.value if engine.state is not EngineState.READY else "stalled"
    return Response({"status": state, "detail": engine.unavailable_reason() if state != "stalled" else
                     "a step has run for too long"}, status_code=503)


@get("/metrics", media_type="text/plain; version=0.0.4; charset=utf-8")
async def metrics(request: Request) -> bytes:
    return _state(request).metrics.render()


@get("/v1/plugins")
async def plugins(request: Request) -> dict:
    """The resolved engine: the implementation of each kind, and everything installed."""
    state = _state(request)
    spec = state.spec
    if spec is None:
        raise OpenAIError(503, state.engine.unavailable_reason(), headers={"Retry-After": "5"})
    chosen = {kind: {"name": impl.name, "distribution": impl.distribution, "version": impl.version}
              for kind, impl in spec.chosen.items() if kind in KINDS}
    selected = {kind: impl.name for kind, impl in spec.chosen.items()}
    installed = [{**asdict(row), "aliases": list(row.aliases), "reasons": list(row.reasons)}
                 for row in collect_status(spec.catalog, spec.context, selected)]
    plugins_loaded = [{"name": name, "distribution": dist, "version": version}
                      for name, (dist, version) in spec.catalog.plugins.items()]
    return {"object": "plugins", "model": state.model_name, "architecture": spec.context.model.architecture,
            "device": str(spec.context.device), "dtype": spec.context.dtype, "block_size": spec.config.block_size,
            "chosen": chosen, "plugins": plugins_loaded, "implementations": installed}


def _tokenizer(state: ServerState):
    state.require_ready()
    if state.tokenizer is None:
        raise bad_request("this model has no tokenizer")
    return state.tokenizer


@post("/tokenize", status_code=200)
async def tokenize(request: Request) -> dict:
    state = _state(request)
    body = await parse_body(request, TokenizeRequest)
    state.check_model(body.model)
    tokenizer = _tokenizer(state)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("send exactly one of prompt and messages", param="prompt")
    if body.prompt is not None:
        special = body.add_special_tokens is not False
        ids = await state.tokenize(lambda: tokenizer.encode(body.prompt, add_special_tokens=special))
    else:
        add_generation_prompt = body.add_generation_prompt is not False

        def render_and_encode() -> list[int]:
            text = render_chat(state, body.messages, add_generation_prompt)
            return tokenizer.encode(text, add_special_tokens=False)

        ids = await state.tokenize(render_and_encode)
    return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}


@post("/detokenize", status_code=200)
async def detokenize(request: Request) -> dict:
    state = _state(request)
    body = await parse_body(request, DetokenizeRequest)
    state.check_model(body.model)
    tokenizer = _tokenizer(state)
    vocab = len(tokenizer)
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"tokens must be in [0, {vocab}); got {bad[:5]}", param="tokens")
    return {"prompt": await state.tokenize(tokenizer.decode, body.tokens)}
