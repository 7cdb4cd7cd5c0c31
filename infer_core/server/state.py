"""What the app's handlers share: settings, the AsyncEngine, its tokenizer, metrics, the model's name."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_core.engine.async_engine import AsyncEngine
from infer_core.engine.engine import Engine
from infer_core.engine.engine_state import EngineState
from infer_core.loader import assemble
from infer_core.models.source import DEFAULT_MODEL_NAME
from infer_core.server.errors import OpenAIError, bad_request
from infer_core.server.metrics import ServerMetrics
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)

# generation_config.json keys that become request defaults (as vLLM's --generation-config auto)
_GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


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
    tokenizer: Any = None  # the handlers' own copy: the engine thread's is not shared across threads
    max_model_len: int = 0
    defaults: dict[str, Any] = field(default_factory=dict)
    spec: Any = None  # the assembled EngineSpec, for /v1/plugins
    # one thread for tokenizing and chat templates: a 16 MiB prompt must not stall the event loop,
    # and one tokenizer instance is not safe to use from several threads at once
    tokenizer_thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="infer-tokenizer"))

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.model_name, lambda: self.engine.snapshot,
                                     lambda: self.engine.parallel_metrics())
        self.engine = AsyncEngine(self._build_engine, self.metrics.observe)

    async def tokenize(self, work: Callable[..., Any], *args: Any) -> Any:
        """Run ``work(*args)`` (tokenizer calls) on the tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_thread, work, *args)

    def _build_engine(self) -> Engine:
        """Runs on the engine thread: assemble, load, then publish what the handlers need."""
        started = time.monotonic()
        spec = assemble(self.settings)
        engine = Engine(spec)
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.max_model_len = engine.config.max_model_len
        self.defaults = generation_defaults(engine.config.source.path)
        self.spec = spec
        if self.defaults:
            logger.info("sampling defaults from generation_config.json: %s", self.defaults)
        logger.info("model %s loaded in %.1f s; serving it as %r", engine.config.source.name,
                    time.monotonic() - started, self.model_name)
        return engine

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
