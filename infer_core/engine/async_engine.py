"""AsyncEngine: the engine core in a process of its own, and the frontend's processing on the event loop.

As vLLM v1: the server's process tokenizes, detokenizes, checks stop strings and frames SSE; the
engine-core process (engine/core_process.py) loops scheduler -> executor -> decoding policy and
sends each step's new token ids back, so nothing the HTTP side does (a huge body, a slow client,
the GIL) holds a step. Everything here runs on the event loop's thread: ``add_request`` sends the
completions and waits for the core's ack (a refusal raises here), each ``CoreStep`` read runs the
output processor and feeds the streams, a stop string found ends the completion in the core, and
an abort ends the stream at once and frees the KV blocks at the core's next look at its commands.
The core's exit, expected or not, ends every stream with EngineDeadError.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence

from infer_core.engine.core_client import CoreClient
from infer_core.engine.core_messages import (INTERNAL_ERROR, AddRequest, CoreFailed, CoreReady, CoreStarted, CoreStep,
                                              FinishRequests, RemoteRequest, decode_updates)
from infer_core.engine.engine_state import EngineSnapshot, EngineState, unavailable_reason
from infer_core.engine.input_processor import InputProcessor, completion_ids
from infer_core.engine.output_processor import OutputProcessor
from infer_core.engine.core_stats_relay import NO_CORE_STATS, CoreStatsCopy, engine_snapshot, with_stats
from infer_core.engine.request_stream import RequestStream
from infer_core.errors import EngineDeadError, RequestError
from infer_core.interfaces import ParallelMetric, RequestStatus
from infer_core.outputs import RequestOutput
from infer_core.runner.gc_policy import STEP_LOOP_GC
from infer_core.sampling_params import SamplingParams
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)

STALL_AFTER_S = 120.0  # a core with work that sent nothing for this long counts as "not making progress"


class AsyncEngine:
    """Owns the engine-core process. ``start`` returns at once; the model loads over there.

    ``on_started(engine)`` runs on the event loop once the core sent its configuration and
    tokenizer (``config``, ``chosen``, ``tokenizer`` are set then), before the weights are loaded.
    """

    def __init__(self, settings: EngineSettings,
                 observe: Callable[[list[RequestOutput], float], None] | None = None,
                 on_started: Callable[[AsyncEngine], None] | None = None,
                 on_ready: Callable[[AsyncEngine], None] | None = None) -> None:
        self.settings = settings
        self._observe = observe
        self._on_started = on_started
        self._on_ready = on_ready
        self._client = CoreClient(settings, self._on_message, self._on_exit)
        self._streams: dict[str, RequestStream] = {}
        self._pending: dict[str, asyncio.Future] = {}  # request id -> the core's ack
        self._known: dict[str, RemoteRequest] = {}  # completions the core runs for us
        self._finished: dict[str, int] = {}  # finish_reason -> completions
        self._last_heard = time.monotonic()
        self._holds_gc = False
        self.inputs: InputProcessor | None = None
        self.outputs: OutputProcessor | None = None
        self.config = None  # EngineConfig, once the core sent it
        self.chosen: dict | None = None
        self.tokenizer = None
        self.num_kv_blocks: int | None = None
        self.state = EngineState.LOADING
        self.error: str | None = None
        self.load_failed = False  # the core died before it was ready: this engine never served
        self.snapshot = EngineSnapshot()
        self._stats = NO_CORE_STATS  # the parallel series (EP's load) and spec-decoding counters last sent
        self.loaded = threading.Event()  # set when loading ended, either way

    @property
    def core_pid(self) -> int | None:
        return self._client.pid

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._client.start(loop)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the core process (what still runs there is dropped: ``drain`` first); any thread."""
        if self.state is not EngineState.DEAD:
            self.state = EngineState.STOPPED
        self._client.stop(timeout)
        self._release_gc()

    @property
    def is_healthy(self) -> bool:
        """Ready, its core alive, and not silent for long with work to do."""
        if self.state is not EngineState.READY or not self._client.is_alive:
            return False
        return not self._streams or time.monotonic() - self._last_heard < STALL_AFTER_S

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    @property
    def num_pending_adds(self) -> int:
        """Requests sent to the core that it has not taken in yet."""
        return len(self._pending)

    def unavailable_reason(self) -> str:
        return unavailable_reason(self.state, self.error)

    async def add_request(self, request_id: str, prompt: str | Sequence[int], params: SamplingParams,
                          add_special_tokens: bool = True, priority: int = 0) -> RequestStream:
        """Send a request to the core and wait for its ack; raises what the core's refusal says (a
        structured-output spec that does not compile, say).

        Text prompts are tokenized here, on the event loop: the server sends token ids. ``priority``:
        lower runs first under the ``priority`` scheduler.
        """
        if self.state is not EngineState.READY:
            raise EngineDeadError(self.unavailable_reason())
        inputs, outputs = self.inputs, self.outputs
        params = inputs.sampling_params(params)
        children = completion_ids(request_id, params)
        for taken in (request_id, *(cid for cid, _ in children)):
            if outputs.is_known(taken) or taken in self._known:
                what = "request id" if taken == request_id else f"completion id of request {request_id!r}"
                raise RequestError(f"{what} {taken!r} is already in use", param="request_id")
        text, prompt_ids = inputs.tokenize(prompt, add_special_tokens)
        arrival = time.monotonic()
        completions = inputs.core_requests(children, prompt_ids, params, arrival, priority)
        if not self._streams:
            self._last_heard = arrival  # the stall clock starts with the work
            self._hold_gc()
        outputs.add(request_id, text, list(prompt_ids), children, arrival)
        stream = self._streams[request_id] = RequestStream(request_id)
        for cid, _ in children:
            self._known[cid] = RemoteRequest(cid)
        ack = self._pending[request_id] = asyncio.get_running_loop().create_future()
        self._client.send(AddRequest(request_id, completions))
        try:
            await ack
        except asyncio.CancelledError:
            self.abort(request_id)  # the core takes the add, then this
            raise
        except BaseException:
            self._forget(request_id)
            raise
        finally:
            self._pending.pop(request_id, None)
        return stream

    def abort(self, request_id: str) -> None:
        """End a request now: its stream gets a final "abort" output; the core frees its blocks."""
        if self.outputs is None:
            return
        children = self.outputs.children_of(request_id)
        if children:
            self._client.send(FinishRequests(children, RequestStatus.FINISHED_ABORTED))
            for cid in children:
                self._known.pop(cid, None)
        output = self.outputs.abort(request_id)
        if output is not None:
            self._dispatch([output])

    def _forget(self, request_id: str) -> None:
        """A request the core refused: nothing of it is left here."""
        for cid in self.outputs.children_of(request_id):
            self._known.pop(cid, None)
        self.outputs.abort(request_id)
        self._streams.pop(request_id, None)
        if not self._streams:
            self._release_gc()

    async def drain(self, timeout: float, abort_wait: float = 10.0) -> int:
        """Refuse new requests, wait up to ``timeout`` s for running ones, abort the rest; how many were aborted.

        Each aborted stream gets its final output at once; ``abort_wait`` bounds the wait for
        requests still being added (their ack, then their abort).
        """
        if self.state is EngineState.READY:
            self.state = EngineState.DRAINING
        deadline = time.monotonic() + timeout
        while self.num_unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        aborted = list(self._streams)
        for request_id in aborted:
            self.abort(request_id)
        deadline = time.monotonic() + abort_wait
        while self.num_unfinished and self._client.is_alive and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.num_unfinished:
            logger.warning("%d requests did not end within %.0f s of being aborted", self.num_unfinished, abort_wait)
        return len(aborted)

    def _on_message(self, message) -> None:
        self._last_heard = time.monotonic()
        if isinstance(message, CoreStep):
            self._on_step(message)
        elif isinstance(message, CoreStarted):
            self.config, self.chosen, self.tokenizer = message.config, message.chosen, message.tokenizer
            self.inputs = InputProcessor(self.tokenizer, self.config.model.vocab_size, self.config.max_model_len)
            self.outputs = OutputProcessor(self.tokenizer)
            if self._on_started is not None:
                self._on_started(self)
        elif isinstance(message, CoreReady):
            self.num_kv_blocks = message.num_kv_blocks
            if self.state is EngineState.LOADING:
                self.state = EngineState.READY
            self.loaded.set()
            if self._on_ready is not None:
                self._on_ready(self)
        elif isinstance(message, CoreStatsCopy):
            self._stats = message
            self.snapshot = with_stats(self.snapshot, message)
        elif isinstance(message, CoreFailed):
            logger.error("the engine core failed: %s", message.reason)
            self._die(message.reason)

    def _on_step(self, step: CoreStep) -> None:
        self.snapshot = engine_snapshot(step.counters, self._finished, self._stats)
        for request_id in step.admitted:
            ack = self._pending.get(request_id)
            if ack is not None and not ack.done():
                ack.set_result(None)
        for request_id, message, param, code in step.refused:
            ack = self._pending.get(request_id)
            if ack is not None and not ack.done():
                ack.set_exception(RuntimeError(message) if code == INTERNAL_ERROR else
                                  RequestError(message, param=param, code=code))
        if not step.request_ids and not step.prompt_logprobs:
            return
        known = self._known
        outputs, stopped = self.outputs.process(decode_updates(step, known), step.prompt_logprobs)
        if stopped:
            self._client.send(FinishRequests(stopped, RequestStatus.FINISHED_STOPPED))
            for cid in stopped:
                known.pop(cid, None)
        for row, _, _ in step.ended:
            known.pop(step.request_ids[row], None)
        self._dispatch(outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        if self._observe is not None and outputs:
            self._observe(outputs, time.monotonic())
        streams = self._streams
        for output in outputs:
            stream = streams.get(output.request_id)
            if stream is None:
                continue
            stream.put(output)
            if output.finished:
                del streams[output.request_id]
                finished = self._finished
                for completion in output.outputs:
                    reason = completion.finish_reason or "abort"
                    finished[reason] = finished.get(reason, 0) + 1
        if not streams:
            self._release_gc()

    def parallel_metrics(self) -> list[ParallelMetric]:
        return self._stats.parallel

    def _on_exit(self, exitcode: int | None) -> None:
        if self.state is EngineState.STOPPED or self.state is EngineState.DEAD:
            self.loaded.set()
            return
        self._die(f"the engine core process exited with code {exitcode}" + (
            " (killed by a signal: out of memory?)" if exitcode is not None and exitcode < 0 else ""))

    def _die(self, reason: str) -> None:
        if self.state is EngineState.DEAD:
            return
        self.load_failed = self.state is EngineState.LOADING
        self.state = EngineState.DEAD
        self.error = reason
        error = EngineDeadError(f"the engine stopped after an error: {reason}")
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.put(error)
        for ack in self._pending.values():
            if not ack.done():
                ack.set_exception(error)
        self._known.clear()
        self._release_gc()
        self.loaded.set()

    def _hold_gc(self) -> None:
        if not self._holds_gc:
            self._holds_gc = True
            STEP_LOOP_GC.hold()  # a full collection of this process's heap would stall every stream

    def _release_gc(self) -> None:
        if self._holds_gc:
            self._holds_gc = False
            STEP_LOOP_GC.release()
