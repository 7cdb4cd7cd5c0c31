"""The Executor of a multi-rank engine: rank 0 in the engine's process, ranks 1..N-1 driven over the channel.

Any strategy whose ranks each run the core's worker on their shard uses it (tensor parallelism, expert
parallelism), naming itself and how a rank joins the group in a ``GroupSpec``. Each step is one small message
(the pickled SchedulerOutput) pushed to every worker; then every rank runs the same forward on its shard, with
the layers' collectives keeping them in lockstep. The LM head all-gathers the logits, so every rank samples
the same tokens and keeps them on its device: the next step reads a pending token there, and the engine may launch step N+1 before it
reads step N (overlapped scheduling). Only rank 0's tokens come back; the workers never wait for
theirs. A worker that dies turns the next step, ``check_health`` or the result in flight into an
EngineDeadError that quotes its last stderr lines, and the rest of the ranks are stopped with it.

What must be let go of (processes, store, rank 0's worker, the process group) is in ``ranks.Ranks``,
released by ``shutdown()`` or, for an executor nobody shut down, when it is garbage-collected or
the interpreter exits (``weakref.finalize``): a dropped engine frees the process for the next one.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
import weakref
from typing import Any

import torch.distributed as dist

from infer_core.distributed.channel import Call
from infer_core.distributed.group import (
    COLLECTIVE_TIMEOUT,
    GroupSpec,
    RankPlacement,
    backend_for,
    torchrun_placement,
    torchrun_store,
)
from infer_core.distributed.processes import SpawnedWorkers
from infer_core.distributed.rank_loop import INIT, JOIN, STEP
from infer_core.distributed.ranks import Ranks
from infer_core.interfaces import (
    EngineDeadError,
    Executor,
    ParallelMetric,
    PendingOutput,
    RunnerOutput,
    SchedulerOutput,
    WorkerFactory,
)

logger = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"
STARTUP_TIMEOUT = 600.0  # a worker that is not up (imports, CUDA context) within this is reported dead
CRASH_GRACE = 5.0  # after a failed step: how long to wait for a worker's exit to show


def _drop_locals(error: BaseException | None) -> None:
    """Clear the finished frames of ``error``'s traceback (and of the errors it chains to).

    Their locals hold the runner (``self`` of its methods); only once it is gone can the group be
    aborted (see ``release_worker``). The tracebacks still print.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


class CheckedOutput(PendingOutput):
    """Rank 0's output of a launched step, read only once every rank is known to be alive.

    A worker lost mid-step (NCCL aborted) can leave rank 0 with a result that is not to be trusted,
    so the health check comes after the wait; a failure while waiting is blamed on a dead worker
    when one died.
    """

    def __init__(self, executor: RankExecutor, pending: PendingOutput) -> None:
        self.executor = executor
        self.pending = pending

    def result(self) -> RunnerOutput:
        try:
            output = self.pending.result()
        except EngineDeadError:
            raise
        except BaseException as e:
            self.executor.raise_if_a_worker_died(e)
            raise
        self.executor.check_health()
        return output


class RankExecutor(Executor):
    """Drives every rank of one group; the engine talks only to this. ``spec`` names the strategy and says how
    each rank joins the group."""

    supports_overlap = True  # every rank samples and keeps its sampled ids on its device

    def __init__(self, engine_config: Any, world_size: int, worker_factory: WorkerFactory, spec: GroupSpec) -> None:
        self.world_size = world_size
        self.spec = spec
        self.is_dead = False
        self.is_shut_down = False
        self._death_message: str | None = None
        backend = backend_for(engine_config.device)
        placement = torchrun_placement(engine_config.device)
        workers = None
        if placement is not None:  # torchrun started every rank; ranks > 0 run the strategy's launch module
            if spec.torchrun_module is None:
                raise EngineDeadError(f"the {spec.name} strategy spawns its ranks on one host and does not run "
                                      f"under torchrun (RANK and WORLD_SIZE are set): run it without torchrun")
            if placement.rank != 0 or placement.world_size != world_size:
                raise EngineDeadError(
                    f"under torchrun the {spec.name} engine runs on rank 0 of {world_size} ranks; this is "
                    f"rank {placement.rank} of WORLD_SIZE={placement.world_size}: start every rank with "
                    f"`torchrun ... -m {spec.torchrun_module}` and --nproc-per-node x --nnodes = {world_size}"
                )
            store = torchrun_store(placement)
        else:
            placement = RankPlacement(0, world_size, 0, backend)
            if placement.is_cuda:
                # A spawned worker's death is handled here (the group is aborted, the engine reports
                # dead): NCCL's watchdog must clean up, not tear down the engine's (the server's) process.
                os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
            store = dist.TCPStore(LOCALHOST, 0, None, True, COLLECTIVE_TIMEOUT, wait_for_workers=False)
            others = [RankPlacement(r, world_size, r, backend) for r in range(1, world_size)]
            workers = SpawnedWorkers(others, LOCALHOST, store.port)
        self.ranks = ranks = Ranks(placement, store, workers, spec)
        # No reference to self in it: the ranks are released when this executor is collected.
        self._finalizer = weakref.finalize(self, ranks.close)
        try:
            channel = ranks.channel
            self.worker_pids = [channel.wait_for(r, self.check_health, STARTUP_TIMEOUT).value
                                for r in channel.worker_ranks]
            channel.send(Call(INIT, (engine_config, worker_factory, spec)))
            # a worker that cannot take the configuration or set up its device is reported now, with its own
            # error: in the group's rendezvous rank 0 would wait for it until COLLECTIVE_TIMEOUT
            self._collect()
            channel.send(Call(JOIN))  # every rank joins the group, then builds its worker
            ranks.join(engine_config)
            if workers is not None:
                workers.watch(ranks.on_worker_death)
            ranks.worker = worker_factory(engine_config, ranks.parallel,
                                          placement.local_rank if placement.is_cuda else None)
            self._collect()
        except BaseException:
            self.shutdown()
            raise

    @property
    def worker(self):
        """Rank 0's worker (None once shut down)."""
        return self.ranks.worker

    @property
    def parallel(self):
        """Rank 0's ParallelContext (None once shut down)."""
        return self.ranks.parallel

    # liveness ---------------------------------------------------------------------------------

    def check_health(self) -> None:
        if self.is_shut_down:
            raise EngineDeadError(f"the {self.spec.name} executor was shut down")
        ranks = self.ranks
        failures = ranks.workers.failures() if ranks.workers is not None else []
        if failures or ranks.death is not None or self.is_dead:
            self._die("; ".join(failures) or ranks.death or "an earlier step failed")

    def _die(self, reason: str, cause: BaseException | None = None) -> None:
        """Stop every rank and raise: the group cannot continue without one of its shards.

        The message names how the dead ranks ended and quotes what they last wrote to stderr; it is
        made once, when the death is found (later, the ranks this stopped have exited too).
        """
        self.is_dead = True
        _drop_locals(cause)  # its frames would keep the runner, and so its CUDA graphs, alive
        if self._death_message is None:
            workers = self.ranks.workers
            words = workers.last_words() if workers is not None else ""
            self._death_message = (f"a {self.spec.name} worker died ({reason}); restart the engine"
                                   + (f"\n{words}" if words else ""))
        self.ranks.stop(graceful=False)
        raise EngineDeadError(self._death_message) from cause

    # the Executor contract ---------------------------------------------------------------------

    def _collect(self) -> list[Any]:
        """Every worker's result of the last call; a worker's failure stops every rank."""
        try:
            return self.ranks.channel.collect(self.check_health)
        except EngineDeadError:
            self.is_dead = True
            self.ranks.stop(graceful=False)
            raise

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        """Run ``method`` on every rank at once (rank 0 here); the results by rank."""
        self.check_health()
        self.ranks.channel.send(Call(method, args))
        try:
            mine = getattr(self.worker, method)(*args)
            return [mine, *self._collect()]
        except EngineDeadError:
            raise
        except BaseException as e:
            self.raise_if_a_worker_died(e)
            raise

    def raise_if_a_worker_died(self, error: BaseException) -> None:
        """A failed collective usually means a worker died: wait briefly for its exit to show."""
        workers = self.ranks.workers
        if workers is None:
            return
        deadline = time.monotonic() + CRASH_GRACE
        while time.monotonic() < deadline:
            failures = workers.failures()
            if failures:
                self._die("; ".join(failures), error)
            time.sleep(0.05)

    def start(self) -> int:
        self._call_all("load_model")  # no collectives: every rank loads, then they profile together
        blocks = self._call_all("profile_num_blocks")
        logger.info("KV blocks each rank can hold: %s; using the smallest", blocks)
        return min(blocks)

    def init_kv_cache(self, num_blocks: int) -> None:
        self._call_all("init_kv_cache", num_blocks)

    def execute_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Send the step to every worker, launch it here, and return before its tokens are read."""
        self.check_health()
        self.ranks.channel.send(Call(STEP, (scheduler_output,), reply=False))
        try:
            pending = self.worker.execute_async(scheduler_output)
        except BaseException as e:
            self.raise_if_a_worker_died(e)
            raise
        return CheckedOutput(self, pending)

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        return self.execute_async(scheduler_output).result()

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        return self._call_all(method, *args)

    def metrics(self) -> list[ParallelMetric]:
        parallel = self.ranks.parallel
        return parallel.communicator.metrics() if parallel is not None else []

    def shutdown(self) -> None:
        """Stop every rank and leave the process group (at once after a failure); a second call does nothing."""
        self.is_shut_down = True
        self._finalizer()
