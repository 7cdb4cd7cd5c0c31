"""GET /v1/models, /health, /metrics, /v1/plugins; POST /tokenize and /detokenize."""

from __future__ import annotations

from litestar import Request, Response, get, post
from litestar.openapi.datastructures import ResponseSpec

from infer_core.config import KINDS
from infer_core.engine.engine_state import EngineState
from infer_core.plugins_report import collect_status
from infer_core.server.errors import OpenAIError, bad_request
from infer_core.server.http import JSONBody
from infer_core.server.openapi import documented
from infer_core.server.prompt_bound import check_text
from infer_core.server.response_schemas import (
    ChosenImplementation,
    DetokenizeResponse,
    Health,
    ImplementationStatus,
    LoadedPlugin,
    ModelCard,
    ModelFeatures,
    ModelList,
    PluginsReport,
    TokenizeResponse,
)
from infer_core.server.schemas import DetokenizeRequest, TokenizeRequest
from infer_core.server.state import ServerState, render_chat
from infer_core.server.tool_parsers import PARSERS
from infer_core.server.unsupported import unsupported_fields

# what the chat and completions routes implement beyond sampling, for /v1/models
FEATURES = {
    "response_format": ["text", "json_object", "json_schema"],
    "structured_outputs": ["json", "json_object", "regex", "choice", "grammar"],  # and guided_<name>
    "tool_choice": ["none", "auto", "required", "function"],
    "tool_call_parsers": list(PARSERS),
}

_ERRORS = (400, 404, 413, 415, 503)


def _state(request: Request) -> ServerState:
    return request.app.state.server


@get("/v1/models", responses=documented(ModelList, "the served model"))
async def list_models(request: Request) -> ModelList:
    """The served model (OpenAI's model list), with its context length once loaded and the features served."""
    state = _state(request)
    card = ModelCard(state.model_name, "model", state.created, "infer", state.model_name, None,
                     state.max_model_len or None, ModelFeatures(**FEATURES, unsupported_fields=unsupported_fields()))
    return ModelList("list", [card])


@get("/health", responses={
    200: ResponseSpec(Health, description="ready and making progress", generate_examples=False),
    503: ResponseSpec(Health, description="loading, draining, dead, stopped, or stalled", generate_examples=False)})
async def health(request: Request) -> Response[Health]:
    """200 when ready and making progress; 503 while loading, draining, dead or stuck."""
    engine = _state(request).engine
    if engine.is_healthy:
        return Response(Health("ok"), status_code=200)
    state = engine.state.value if engine.state is not EngineState.READY else "stalled"
    return Response(Health(state, engine.unavailable_reason() if state != "stalled" else
                           "a step has run for too long"), status_code=503)


@get("/metrics", media_type="text/plain; version=0.0.4; charset=utf-8",
     response_description="Prometheus metrics under vLLM's names with the infer: prefix")
async def metrics(request: Request) -> bytes:
    return _state(request).metrics.render()


@get("/v1/plugins", responses=documented(PluginsReport, "the resolved engine and every installed implementation",
                                          503))
async def plugins(request: Request) -> PluginsReport:
    """The resolved engine: the implementation of each kind, and everything installed."""
    state = _state(request)
    spec = state.spec
    if spec is None:
        raise OpenAIError(503, state.engine.unavailable_reason(), headers={"Retry-After": "5"})
    chosen = {kind: ChosenImplementation(impl.name, impl.distribution, impl.version)
              for kind, impl in spec.chosen.items() if kind in KINDS}
    selected = {kind: impl.name for kind, impl in spec.chosen.items()}
    installed = [ImplementationStatus(row.kind, row.name, list(row.aliases), row.distribution, row.version,
                                      row.can_run, list(row.reasons), row.selected)
                 for row in collect_status(spec.catalog, spec.context, selected)]
    plugins_loaded = [LoadedPlugin(name, dist, version) for name, (dist, version) in spec.catalog.plugins.items()]
    return PluginsReport("plugins", state.model_name, spec.context.model.architecture, str(spec.context.device),
                         spec.context.dtype, spec.config.block_size, chosen, plugins_loaded, installed)


def _tokenizer(state: ServerState):
    state.require_ready()
    if state.tokenizer is None:
        raise bad_request("this model has no tokenizer")
    return state.tokenizer


@post("/tokenize", status_code=200, dto=JSONBody, return_dto=None,
      responses=documented(TokenizeResponse, "the token ids, their count, and the context length", *_ERRORS))
async def tokenize(request: Request, data: TokenizeRequest) -> TokenizeResponse:
    """A prompt, or chat messages through the chat template, as token ids (vLLM's /tokenize)."""
    state = _state(request)
    body = data
    state.check_model(body.model)
    tokenizer = _tokenizer(state)
    if body.prompt is not None:
        special = body.add_special_tokens is not False
        prompt = body.prompt

        check_text(tokenizer, prompt, state.max_model_len, "your prompt is", "prompt", reserve=0)
        ids = await state.tokenize(lambda: tokenizer.encode(prompt, add_special_tokens=special))
    else:
        add_generation_prompt = body.add_generation_prompt is not False

        def render_bound_and_encode() -> list[int]:
            text = render_chat(state, body.messages, add_generation_prompt)
            check_text(tokenizer, text, state.max_model_len, "the messages, formatted by the chat template, are",
                       "messages", reserve=0)
            return tokenizer.encode(text, add_special_tokens=False)

        ids = await state.tokenize(render_bound_and_encode)
    return TokenizeResponse(ids, len(ids), state.max_model_len)


@post("/detokenize", status_code=200, dto=JSONBody, return_dto=None,
      responses=documented(DetokenizeResponse, "the text of the token ids", *_ERRORS))
async def detokenize(request: Request, data: DetokenizeRequest) -> DetokenizeResponse:
    """Token ids back to text (vLLM's /detokenize)."""
    state = _state(request)
    body = data
    state.check_model(body.model)
    tokenizer = _tokenizer(state)
    vocab = len(tokenizer)
    bad = [t for t in body.tokens if t >= vocab]
    if bad:
        raise bad_request(f"tokens must be in [0, {vocab}); got {bad[:5]}", param="tokens")
    return DetokenizeResponse(await state.tokenize(tokenizer.decode, body.tokens))
