"""``infer serve``: uvicorn around the app, with a graceful SIGTERM.

On SIGTERM (or the first Ctrl-C) the server stops taking requests (503, ``/health`` 503), lets
running requests finish for up to ``shutdown_timeout`` seconds, aborts the rest (finish_reason
"abort"), then exits 0. A second Ctrl-C exits at once. A model that cannot be loaded is logged
with its cause and the server exits 1: it could never answer.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from types import FrameType

import uvicorn

from infer_core.engine.engine_state import EngineState
from infer_core.server.app import create_app
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, but a stop signal drains the engine before uvicorn shuts down."""

    def __init__(self, config: uvicorn.Config, settings: EngineSettings) -> None:
        super().__init__(config)
        self.settings = settings
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.load_failed = False

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        watch = self._loop.create_task(self._exit_if_loading_fails())
        try:
            await super().serve(sockets)
        finally:
            watch.cancel()

    async def _exit_if_loading_fails(self) -> None:
        engine = self.config.app.state.server.engine
        while not engine.loaded.is_set():
            await asyncio.sleep(0.2)
        if engine.load_failed:
            logger.error("the model could not be loaded, so this server could never answer: stopping "
                         "(the cause is logged above: %s)", engine.error)
            self.load_failed = True
            self.should_exit = True

    def _log_started_message(self, listeners) -> None:
        """Where the server listens, without uvicorn's "running on", which would claim a readiness the
        model loading in the engine core has not reached yet: the "ready" line says that."""
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        port = self.config.port or listeners[0].getsockname()[1]
        state = self.config.app.state.server
        state.url = f"http://{host}:{port}"
        stack = http_stack(self.config.http_protocol_class, asyncio.get_running_loop())
        if state.engine.state is EngineState.LOADING:
            logger.info("listening on %s (%s) while the model loads: /health answers 503 until the 'ready' line "
                        "(Ctrl+C to quit)", state.url, stack)
        else:
            logger.info("listening on %s (%s; Ctrl+C to quit)", state.url, stack)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            self.force_exit = self._draining and sig == signal.SIGINT
            self.should_exit = True
            return
        self._draining = True
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain(sig)))

    async def _drain(self, sig: int) -> None:
        engine = self.config.app.state.server.engine
        timeout = self.settings.shutdown_timeout
        logger.info("received %s: refusing new requests, waiting up to %.0f s for %d running",
                    signal.Signals(sig).name, timeout, engine.num_unfinished)
        aborted = await engine.drain(timeout)
        if aborted:
            logger.warning("aborted %d requests still running after %.0f s", aborted, timeout)
        await asyncio.sleep(0.2)  # let the final chunks of the streams reach their clients
        self.should_exit = True


_PARSERS = {"HttpToolsProtocol": "httptools", "H11Protocol": "h11"}


def http_stack(protocol_class: type, loop: asyncio.AbstractEventLoop) -> str:
    """Which event loop and HTTP implementation serve, as the start line names them: uvicorn's "auto" takes
    uvloop and httptools when they are installed, else asyncio's loop and h11, which frames every streamed
    chunk in Python (the fix is then in the text)."""
    loop_name = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    parser = _PARSERS.get(protocol_class.__name__, protocol_class.__name__)
    text = f"{loop_name} event loop, {parser} HTTP"
    missing = [name for name, used in (("uvloop", loop_name == "uvloop" or sys.platform == "win32"),
                                       ("httptools", parser != "h11")) if not used]
    if missing:
        text += f"; `pip install {' '.join(missing)}` serves streams with less CPU a token"
    return text


def serve(settings: EngineSettings) -> int:
    """Run the server until stopped; the exit code."""
    app = create_app(settings)
    # "auto": uvloop and httptools where installed (the core's dependencies), named in the listening line
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info", loop="auto", http="auto",
                            timeout_graceful_shutdown=max(5, int(settings.shutdown_timeout)), access_log=False)
    server = _DrainingServer(config, settings)
    server.run()
    return 0 if server.started and not server.load_failed else 1
