"""AsyncEngine: the Engine on its own thread, driven by one loop, fed from asyncio.

The Engine is single-threaded by design. The server's event loop must stay free to accept and
stream while a step runs, so the engine lives on one background thread that alternates between
applying queued commands (add, abort) and running ``Engine.step()``; outputs travel back to the
event loop with ``call_soon_threadsafe``. Nothing but that thread touches the Engine.
Its lifecycle states and published snapshot are in ``engine_state``; a request's output stream
is in ``request_stream``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from infer_core.engine.engine import Engine
from infer_core.engine.engine_state import EngineSnapshot, EngineState
from infer_core.engine.request_stream import RequestStream, deliver
from infer_core.errors import EngineDeadError
from infer_core.interfaces import ParallelMetric
from infer_core.outputs import RequestOutput
from infer_core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.25  # how often an idle engine thread wakes to check its executor's health
STALL_AFTER_S = 120.0  # a step running longer than this with work pending counts as "not making progress"


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: str | Sequence[int]
    params: SamplingParams
    add_special_tokens: bool
    stream: RequestStream
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass(slots=True)
class _Abort:
    request_id: str


class AsyncEngine:
    """Owns the engine thread. ``start`` returns at once; the model loads on the thread."""

    def __init__(self, build_engine: Callable[[], Engine],
                 observe: Callable[[list[RequestOutput], float], None] | None = None) -> None:
        self._build_engine = build_engine
        self._observe = observe
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # owned by the engine thread
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._num_pending_adds = 0
        self._step_started: float | None = None
        self.engine: Engine | None = None
        self.state = EngineState.LOADING
        self.error: str | None = None
        self.snapshot = EngineSnapshot()
        self.loaded = threading.Event()  # set when loading ended, either way

    # lifecycle --------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="infer-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread (running requests end with "abort") and release the engine."""
        self._stop.set()
        self._commands.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        if self.state is not EngineState.DEAD:
            self.state = EngineState.STOPPED

    @property
    def is_healthy(self) -> bool:
        """Ready, its thread alive, and not stuck in one step."""
        if self.state is not EngineState.READY or self._thread is None or not self._thread.is_alive():
            return False
        started = self._step_started
        return started is None or time.monotonic() - started < STALL_AFTER_S

    @property
    def num_unfinished(self) -> int:
        return len(self._streams) + self._num_pending_adds

    @property
    def num_pending_adds(self) -> int:
        """Requests sent to the engine thread that it has not taken in yet."""
        return self._num_pending_adds

    # the asyncio side -------------------------------------------------------------------------

    async def add_request(self, request_id: str, prompt: str | Sequence[int], params: SamplingParams,
                          add_special_tokens: bool = True) -> RequestStream:
        """Queue a request on the engine thread; raises what ``Engine.add_request`` raises."""
        if self.state is not EngineState.READY:
            raise EngineDeadError(self.unavailable_reason())
        command = _Add(request_id, prompt, params, add_special_tokens, RequestStream(request_id))
        self._num_pending_adds += 1
        try:
            self._commands.put(command)
            await asyncio.wrap_future(command.done)
        except asyncio.CancelledError:
            self.abort(request_id)  # the engine thread may have taken it in already
            raise
        finally:
            self._num_pending_adds -= 1
        return command.stream

    def abort(self, request_id: str) -> None:
        """End a request soon (between steps); its stream gets a final "abort" output."""
        self._commands.put(_Abort(request_id))

    def unavailable_reason(self) -> str:
        if self.state is EngineState.LOADING:
            return "the model is still loading; retry shortly"
        if self.state is EngineState.DRAINING:
            return "the server is shutting down and accepts no new requests"
        if self.state is EngineState.DEAD:
            return f"the engine stopped after an error and must be restarted: {self.error}"
        return "the engine is stopped"

    async def drain(self, timeout: float, abort_wait: float = 10.0) -> int:
        """Refuse new requests, wait up to ``timeout`` s for running ones, abort the rest; how many were aborted.

        After aborting, waits at most ``abort_wait`` s for the aborted streams' final outputs (a
        step in flight must end first); a request still being added is aborted as it arrives.
        """
        if self.state is EngineState.READY:
            self.state = EngineState.DRAINING
        deadline = time.monotonic() + timeout
        while self.num_unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        aborted: set[str] = set()
        deadline = time.monotonic() + abort_wait
        while self.num_unfinished and self._thread is not None and self._thread.is_alive():
            for request_id in set(self._streams.copy()) - aborted:  # the engine thread may change the dict
                self.abort(request_id)
                aborted.add(request_id)
            if time.monotonic() > deadline:
                logger.warning("%d requests did not end within %.0f s of being aborted", self.num_unfinished,
                               abort_wait)
                break
            await asyncio.sleep(0.01)  # let the aborted streams get their final output
        return len(aborted)

    # the engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.engine = self._build_engine()
        except BaseException as e:  # report, never raise on a daemon thread
            logger.exception("the engine failed to load")
            self._die(f"{type(e).__name__}: {e}")
            self.loaded.set()
            return
        self.state = EngineState.READY
        self._publish()
        self.loaded.set()
        logger.info("engine ready")
        try:
            self._loop_until_stopped()
        except BaseException as e:
            logger.exception("the engine failed")
            self._die(f"{type(e).__name__}: {e}")
        finally:
            self._release()

    def _loop_until_stopped(self) -> None:
        engine = self.engine
        assert engine is not None
        while not self._stop.is_set():
            commands = self._take_commands(block=not engine.has_unfinished_requests())
            for command in commands:
                if command is None:
                    return
                self._apply(engine, command)
            if commands:
                self._publish()  # admission control sees new arrivals before the step ends
            engine.executor.check_health()
            if engine.has_unfinished_requests():
                self._step_started = time.monotonic()
                outputs = engine.step()
                self._step_started = None
                self._dispatch(outputs)
            self._publish()

    def _take_commands(self, block: bool) -> list[_Add | _Abort | None]:
        """Every queued command; when idle, wait a little for the first one."""
        commands = []
        try:
            commands.append(self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait())
            while True:
                commands.append(self._commands.get_nowait())
        except queue.Empty:
            return commands

    def _apply(self, engine: Engine, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            output = engine.abort(command.request_id)
            if output is not None:
                self._dispatch([output])
            return
        if not command.done.set_running_or_notify_cancel():
            return  # its HTTP request was cancelled while queued here
        try:
            engine.add_request(command.request_id, command.prompt, command.params,
                               add_special_tokens=command.add_special_tokens)
        except BaseException as e:
            command.done.set_exception(e)
            return
        self._streams[command.request_id] = command.stream
        command.done.set_result(None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        if self._observe is not None and outputs:
            self._observe(outputs, time.monotonic())
        deliveries = []
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            deliveries.append((stream, output))
            if output.finished:
                del self._streams[output.request_id]
        if deliveries:
            self._loop.call_soon_threadsafe(deliver, deliveries)

    def parallel_metrics(self) -> list[ParallelMetric]:
        """The parallel strategy's series (expert parallelism's load), read by /metrics from the server's thread."""
        engine = self.engine
        return engine.executor.metrics() if engine is not None else []

    def _publish(self) -> None:
        engine = self.engine
        stats = engine.stats()
        counters = engine.counters
        self.snapshot = EngineSnapshot(stats.num_running, stats.num_waiting, stats.kv_usage, stats.num_preemptions,
                                       stats.prefix_queried_tokens, stats.prefix_hit_tokens, counters.prompt_tokens,
                                       counters.generation_tokens, dict(counters.finished), engine.decoding.stats())

    def _die(self, reason: str) -> None:
        self.state = EngineState.DEAD
        self.error = reason
        streams, self._streams = list(self._streams.values()), {}
        error = EngineDeadError(f"the engine stopped after an error: {reason}")
        if streams and self._loop is not None:
            self._loop.call_soon_threadsafe(deliver, [(s, error) for s in streams])
        self._fail_pending_adds(error)

    def _fail_pending_adds(self, error: BaseException) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add) and not command.done.done():
                command.done.set_exception(error)

    def _release(self) -> None:
        """Abort what is left, fail queued adds, shut the executor down."""
        engine = self.engine
        if engine is None:
            return
        if not engine.is_dead and self.state is not EngineState.DEAD:
            aborted = [o for o in (engine.abort(rid) for rid in list(self._streams)) if o is not None]
            self._dispatch(aborted)
        self._fail_pending_adds(EngineDeadError("the engine is stopped"))
        try:
            engine.shutdown()
        except Exception:
            logger.exception("engine shutdown failed")

