"""The Litestar app: ``create_app(settings)``, and ``app`` for ``uvicorn infer_core.server.app:app``.

The lifespan starts the engine-core process and returns at once, so the server answers
(``/health`` 503) while the model loads there; on exit it aborts what still runs and stops the core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Router
from litestar.datastructures import State

from infer_core.server import body_worker
from infer_core.server.errors import EXCEPTION_HANDLERS
from infer_core.server.http import decode_large_body, require_api_key
from infer_core.server.info_routes import detokenize, health, list_models, metrics, plugins, tokenize
from infer_core.server.openai_routes import chat_completions, completions
from infer_core.server.openapi import OpenAPIDocument, openapi_config, openapi_json
from infer_core.server.state import ServerState, served_model_name
from infer_core.settings import EngineSettings, load_settings

logger = logging.getLogger(__name__)


def create_app(settings: EngineSettings | None = None) -> Litestar:
    """An app serving one model; the engine loads when the app starts (lifespan)."""
    settings = settings or load_settings()
    server = ServerState(settings, served_model_name(settings))

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        logger.info("loading the model %s in the engine core process…", settings.model or "(the default model)")
        server.engine.start(asyncio.get_running_loop())
        body_worker.start()
        try:
            yield
        finally:
            await server.engine.drain(0)  # whatever still runs ends with "abort"
            await asyncio.to_thread(server.engine.shutdown)
            server.tokenizer_pool.shutdown()
            await asyncio.to_thread(body_worker.stop)
            logger.info("engine stopped")

    protected = Router("/", route_handlers=[chat_completions, completions, list_models, plugins, tokenize, detokenize],
                       guards=[require_api_key], before_request=decode_large_body)
    return Litestar(
        route_handlers=[protected, health, metrics, openapi_json],
        lifespan=[lifespan],
        state=State({"server": server, "openapi": OpenAPIDocument(api_key_required=bool(settings.api_key))}),
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_request_bytes,
        openapi_config=openapi_config(_version()),
        logging_config=None,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infer-core")
    except PackageNotFoundError:
        return "0"


def __getattr__(name: str) -> Any:
    """``app``, built from INFER_* variables on first access (``uvicorn infer_core.server.app:app``)."""
    if name == "app":
        globals()["app"] = built = create_app()
        return built
    raise AttributeError(name)
