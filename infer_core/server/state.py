"""What the app's handlers share: settings, the AsyncEngine, its tokenizer, metrics, the model's name."""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_core.engine.async_engine import AsyncEngine
from infer_core.engine.engine_state import EngineState
from infer_core.loader import EngineSpec, load_catalog
from infer_core.models.source import DEFAULT_MODEL_NAME
from infer_core.server.errors import OpenAIError, bad_request
from infer_core.server.metrics import ServerMetrics
from infer_core.server.tokenizer_pool import TokenizerPool
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)

# generation_config.json keys that become request defaults (as vLLM's --generation-config auto)
_GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
TOKENIZER_THREADS = 4  # a short prompt waits only while this many long ones are being tokenized


def served_model_name(settings: EngineSettings) -> str:
    """What clients call the model: the setting, else the model as given, else the default's name."""
    return settings.served_model_name or settings.model or DEFAULT_MODEL_NAME


def generation_defaults(folder: Path) -> dict[str, Any]:
    """Sampling defaults from the model's generation_config.json, when it has one."""
    path = folder / "generation_config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if isinstance(raw, dict) and raw.get("do_sample") is False:
        raw = {**raw, "temperature": 0.0}  # greedy by the model's own config
    return {k: raw[k] for k in _GENERATION_DEFAULTS if isinstance(raw, dict) and isinstance(raw.get(k), int | float)}


@dataclass(slots=True)
class ServerState:
    settings: EngineSettings
    model_name: str
    engine: AsyncEngine = field(init=False)
    metrics: ServerMetrics = field(init=False)
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    url: str | None = None  # where clients reach the server, for the "ready" line (serve.py knows it)
    tokenizer: Any = None  # the handlers' own copy: the output processor's is used on the event loop
    max_model_len: int = 0
    defaults: dict[str, Any] = field(default_factory=dict)
    spec: EngineSpec | None = None  # the assembled engine as the core reported it, for /v1/plugins
    # threads for tokenizing and chat templates, off the event loop. They share one tokenizer:
    # encode, decode and chat templates only read it (no truncation or padding is ever set).
    tokenizer_pool: TokenizerPool = field(default_factory=lambda: TokenizerPool(TOKENIZER_THREADS))

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.model_name, lambda: self.engine.snapshot,
                                     lambda: self.engine.parallel_metrics())
        self.engine = AsyncEngine(self.settings, self.metrics.observe, on_started=self._on_started,
                                  on_ready=self._on_ready)

    async def tokenize(self, work: Callable[..., Any], *args: Any) -> Any:
        """Run ``work(*args)`` (tokenizer calls) on a tokenizer thread."""
        return await self.tokenizer_pool.run(work, *args)

    def _on_started(self, engine: AsyncEngine) -> None:
        """The core assembled the engine (its weights load now): take what the handlers need."""
        config = engine.config
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.max_model_len = config.max_model_len
        self.defaults = generation_defaults(config.source.path)
        self.spec = EngineSpec(config, load_catalog(self.settings.plugins), engine.chosen)
        if self.defaults:
            logger.info("sampling defaults from generation_config.json: %s", self.defaults)

    def _on_ready(self, engine: AsyncEngine) -> None:
        config = engine.config
        url = self.url or f"http://{self.settings.host}:{self.settings.port}"
        logger.info("ready: model %s (served as %r) on %s at %s, %.1f s after start", config.source.name,
                    self.model_name, config.device, url, time.monotonic() - self.started)

    def require_ready(self) -> None:
        """503 while loading, draining or dead."""
        if self.engine.state is not EngineState.READY:
            raise OpenAIError(503, self.engine.unavailable_reason(), headers={"Retry-After": "5"})

    def check_model(self, requested: str | None) -> None:
        if requested is not None and requested != self.model_name:
            raise OpenAIError(404, f"The model `{requested}` does not exist. This server serves `{self.model_name}`.",
                              param="model", code="model_not_found")

    def check_queue(self, incoming: int) -> None:
        """503 with Retry-After when ``incoming`` more sequences would put over max_queued_requests waiting."""
        limit = self.settings.max_queued_requests
        if incoming > limit:
            raise bad_request(f"this request asks for {incoming} completions (prompts x n), more than the server "
                              f"queues (max_queued_requests={limit}); send fewer prompts or a smaller n", param="n")
        waiting = self.engine.snapshot.num_waiting + self.engine.num_pending_adds
        if waiting + incoming > limit:
            raise OpenAIError(503, f"the server has {waiting} requests waiting (max_queued_requests={limit}); "
                                   f"retry later", headers={"Retry-After": "1"})


def render_chat(state: ServerState, messages: list[Any], add_generation_prompt: bool,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """The conversation as prompt text through the model's (or --chat-template's) template; 400s say why not."""
    tokenizer = state.tokenizer
    if tokenizer is None or not tokenizer.chat_template:
        raise bad_request("this model has no chat template, so chat messages cannot be formatted; start the server "
                          "with --chat-template (a Jinja template or file), or use /v1/completions", param="messages")
    try:
        conversation = [m.for_template() for m in messages]
    except ValueError as e:
        raise bad_request(str(e), param="messages") from None
    try:
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **(template_kwargs or {}))
    except Exception as e:  # noqa: BLE001 - a template's own error is the client's to see
        raise bad_request(f"the chat template could not format these messages: {e}", param="messages") from None
