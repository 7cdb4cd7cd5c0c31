"""The engine-core process: ``EngineCore`` busy-looping on its own, fed and read over one connection.

Started by ``CoreClient`` as a fresh interpreter (forked from multiprocessing's fork server, which
has imported this module; spawned where there is none), never as a fork of the server's process:
a forked CUDA context is unusable, and the server's process never initialises CUDA, as this
process owns the device. It assembles the engine, sends the
configuration and the tokenizer (``CoreStarted``) so the server can prepare while the weights load,
builds the core, says ``CoreReady``, then loops:

- take every command waiting on the connection (blocking a little only while idle); a request with a
  structured-output spec not compiled before waits (unacknowledged) while a thread compiles it, and
  is added once that is done (engine/constraints.py), so no step waits for a compilation;
- if requests were added or ended, answer at once (acks, and counters with the freed KV blocks);
- run one step and send its updates with the counters (the step timeline's totals among them,
  engine/step_tally.py): a message every step, so a silent core with work is a stalled one.

It ends on ``SHUTDOWN``, when the server's end of the connection closes (that process died), or on
an error, which it reports (``CoreFailed``) before exiting. Ctrl-C reaches every process of the
terminal's group: this one ignores it and lets the server decide.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from time import perf_counter
from concurrent.futures import Future
from multiprocessing.connection import Connection

from tqdm import tqdm

from infer_core.engine.core import EngineCore
from infer_core.engine.core_messages import (
    SHUTDOWN,
    AddRequest,
    CoreCounters,
    CoreFailed,
    CoreReady,
    CoreStarted,
    INTERNAL_ERROR,
    CoreStep,
    FinishRequests,
    encode_updates,
)
from infer_core.engine.engine import load_engine_tokenizer, tokenizer_eos
from infer_core.engine.outbox import Outbox
from infer_core.engine.core_stats_relay import CoreStatsRelay
from infer_core.engine.step_tally import StepTally
from infer_core.errors import RequestError
from infer_core.loader import assemble
from infer_core.settings import EngineSettings

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.25  # how often an idle core wakes to check its executor's health
COMPILING_WAIT_S = 0.002  # how often an idle core looks whether a grammar it waits for is compiled


def run_engine_core(settings: EngineSettings, conn: Connection, log_level: int | None, log_format: str | None) -> None:
    """The process's target."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tqdm.set_lock(threading.RLock())  # bars shared with no other process: no semaphore left behind at exit
    if log_format is not None:
        logging.basicConfig(level=log_level or logging.INFO, format=log_format)
    outbox = Outbox(conn, "infer-core-outbox")
    try:
        core = _start(settings, outbox)
        if core is not None:
            _serve(core, conn, outbox)
    finally:
        outbox.close(timeout=10)
        conn.close()


def _start(settings: EngineSettings, outbox: Outbox) -> EngineCore | None:
    try:
        spec = assemble(settings)
        logger.info("loading the tokenizer…")
        start = time.perf_counter()
        tokenizer = load_engine_tokenizer(spec)
        logger.info("tokenizer loaded in %.1f s", time.perf_counter() - start)
        outbox.put(CoreStarted(spec.config, spec.chosen, tokenizer))
        core = EngineCore(spec, tokenizer_eos(tokenizer), tokenizer)
    except BaseException as e:  # report; the server logs it and answers 503
        logger.exception("the engine failed to load")
        outbox.put(CoreFailed(f"{type(e).__name__}: {e}"))
        return None
    outbox.put(CoreReady(core.num_kv_blocks, tuple(sorted(core.eos_token_ids))))
    return core


def _serve(core: EngineCore, conn: Connection, outbox: Outbox) -> None:
    try:
        CoreLoop(core, conn, outbox).run()
    except BaseException as e:
        logger.exception("the engine failed")
        outbox.put(CoreFailed(f"{type(e).__name__}: {e}"))
    finally:
        try:
            core.shutdown()
        except Exception:
            logger.exception("engine shutdown failed")


class CoreLoop:
    def __init__(self, core: EngineCore, conn: Connection, outbox: Outbox) -> None:
        self.core = core
        self.conn = conn
        self.outbox = outbox
        self.admitted: list[str] = []
        self.refused: list[tuple[str, str, str | None, str | None]] = []
        self.changed = False  # requests were added or ended since the last message
        self.stats = CoreStatsRelay(core.executor, core.decoding, outbox)
        self.tally = StepTally()  # the step timeline /metrics serves (engine/step_tally.py)
        self.compiling: list[tuple[AddRequest, Future]] = []  # requests whose grammars a thread compiles

    def run(self) -> None:
        core, tally = self.core, self.tally
        while True:
            busy = core.has_unfinished_requests()
            if not busy:
                tally.idle()
            if not self._take_commands(0 if busy else COMPILING_WAIT_S if self.compiling else IDLE_WAIT_S):
                return
            if self.compiling:
                self._add_compiled()
            if self.changed:
                self._send([], [], [], [], [])
            core.executor.check_health()
            if core.has_unfinished_requests():
                started = perf_counter()
                updates = core.step()
                stepped = perf_counter()
                tally.stepped(core.last_plan, started, stepped)
                self._send(*encode_updates(updates), prompt_logprobs=core.take_prompt_logprobs() or None)
                tally.sent(stepped, perf_counter())
            self.stats.poll()

    def _take_commands(self, wait: float) -> bool:
        """Apply every command waiting (waiting up to ``wait`` s for the first); False: stop."""
        conn = self.conn
        try:
            if not conn.poll(wait):
                return True
            while True:
                if not self._apply(conn.recv()):
                    return False
                if not conn.poll(0):
                    return True
        except (EOFError, OSError):  # the server's process is gone
            logger.warning("the server closed its connection to the engine core: stopping")
            return False

    def _apply(self, command) -> bool:
        if isinstance(command, FinishRequests):
            self.core.finish(command.request_ids, command.status)
            if self.compiling:  # ended while its grammar compiles: never added
                ended = set(command.request_ids)
                self.compiling = [(c, f) for c, f in self.compiling
                                  if not any(r.request_id in ended for r in c.completions)]
        elif isinstance(command, AddRequest):
            compiled = self.core.constraints.compile_later(r.params.structured_outputs for r in command.completions)
            if compiled is not None:
                self.compiling.append((command, compiled))
                return True
            self._add(command)
        elif command == SHUTDOWN:
            return False
        else:
            raise TypeError(f"the engine core got a message it does not know: {command!r}")
        self.changed = True
        return True

    def _add(self, command: AddRequest) -> None:
        try:
            self.core.add(command.completions)
            self.admitted.append(command.request_id)
        except RequestError as e:
            self.refused.append((command.request_id, str(e), e.param, e.code))
        except Exception as e:  # a bug, not the request's fault: the core lives on (the add was all or nothing)
            logger.exception("adding request %s failed", command.request_id)
            self.refused.append((command.request_id, f"{type(e).__name__}: {e}", None, INTERNAL_ERROR))
        self.changed = True

    def _add_compiled(self) -> None:
        """Add the requests whose grammars are compiled now, in the order they came."""
        waiting = []
        for command, compiled in self.compiling:
            if not compiled.done():
                waiting.append((command, compiled))
                continue
            try:
                self.core.constraints.take(compiled)
            except Exception as e:  # the backend failed, not the request: refused, and the core lives on
                logger.exception("compiling the grammar of request %s failed", command.request_id)
                self.refused.append((command.request_id, f"{type(e).__name__}: {e}", None, INTERNAL_ERROR))
                self.changed = True
            else:
                self._add(command)
        self.compiling = waiting

    def _send(self, ids: list, tokens: list, ended: list, first: list, logprobs: list,
              prompt_logprobs: dict | None = None) -> None:
        core = self.core
        counters = CoreCounters.of(core.stats(), core.counters.prompt_tokens, core.counters.generation_tokens,
                                   self.tally.totals())
        self.outbox.put(CoreStep(ids, tokens, ended, first, logprobs, self.admitted, self.refused, counters,
                                 prompt_logprobs))
        if self.changed:
            self.admitted, self.refused, self.changed = [], [], False
