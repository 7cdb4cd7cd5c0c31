"""The tensor-parallel Executor: rank 0 in the engine's process, ranks 1..N-1 driven over the channel.

Each step is one small message (the pickled SchedulerOutput) pushed to every worker; then every
rank runs the same forward on its shard, with the layers' collectives keeping them in lockstep.
The LM head all-gathers the logits, so every rank samples the same tokens and keeps them on its
device: the next step reads a pending token there, and the engine may launch step N+1 before it
reads step N (overlapped scheduling). Only rank 0's tokens come back; the workers never wait for
theirs. A worker that dies turns the next step, ``check_health`` or the result in flight into an
EngineDeadError, and the rest of the ranks are stopped with it.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any

import torch.distributed as dist
from infer_core.errors import EngineDeadError
from infer_core.interfaces import Executor, PendingOutput, RunnerOutput, SchedulerOutput

from infer_parallel_tp.channel import Call, LeaderChannel
from infer_parallel_tp.group import (
    COLLECTIVE_TIMEOUT,
    RankPlacement,
    backend_for,
    join_group,
    leave_group,
    push_layout_for,
    release_worker,
    symm_mem_all_reduce_enabled,
    torchrun_placement,
    torchrun_store,
)
from infer_parallel_tp.worker_main import INIT, STEP, STOP

logger = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"
STARTUP_TIMEOUT = 600.0  # a worker that is not up (imports, CUDA context) within this is reported dead
STOP_TIMEOUT = 10.0  # seconds shutdown waits for workers to exit before killing them
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

    def __init__(self, executor: TensorParallelExecutor, pending: PendingOutput) -> None:
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


class TensorParallelExecutor(Executor):
    """Drives every rank of one tensor-parallel group; the engine talks only to this."""

    supports_overlap = True  # every rank samples and keeps its sampled ids on its device

    def __init__(self, engine_config: Any, world_size: int) -> None:
        from infer_core.runner.worker import Worker

        self.world_size = world_size
        self.workers = None
        self.channel: LeaderChannel | None = None
        self.worker = None
        self.is_dead = False
        self.is_shut_down = False
        self._death: str | None = None
        backend = backend_for(engine_config.device)
        placement = torchrun_placement(engine_config.device)
        if placement is not None:  # torchrun started every rank; ranks > 0 run infer_parallel_tp.launch
            if placement.rank != 0 or placement.world_size != world_size:
                raise EngineDeadError(
                    f"under torchrun the engine runs on rank 0 of tensor_parallel_size={world_size} ranks; this is "
                    f"rank {placement.rank} of WORLD_SIZE={placement.world_size}: start every rank with "
                    f"`torchrun ... -m infer_parallel_tp.launch` and --nproc-per-node x --nnodes = tensor_parallel_size"
                )
            self.store = torchrun_store(placement)
        else:
            placement = RankPlacement(0, world_size, 0, backend)
            if placement.is_cuda:
                # A spawned worker's death is handled here (the group is aborted, the engine reports
                # dead): NCCL's watchdog must clean up, not tear down the engine's (the server's) process.
                os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
            self.store = dist.TCPStore(LOCALHOST, 0, None, True, COLLECTIVE_TIMEOUT, wait_for_workers=False)
            from infer_parallel_tp.processes import SpawnedWorkers

            others = [RankPlacement(r, world_size, r, backend) for r in range(1, world_size)]
            self.workers = SpawnedWorkers(others, LOCALHOST, self.store.port)
        self.placement = placement
        self.channel = LeaderChannel(self.store, world_size)
        try:
            self.worker_pids = [
                self.channel.wait_for(r, self.check_health, STARTUP_TIMEOUT).value for r in self.channel.worker_ranks
            ]
            self.channel.send(Call(INIT, (engine_config,)))  # every rank joins the group, then builds its Worker
            self.parallel = join_group(
                placement, self.store, enable_symm_mem=symm_mem_all_reduce_enabled(engine_config.settings),
                push_layout=push_layout_for(engine_config, world_size),
            )
            if self.workers is not None:
                self.workers.watch(self._on_worker_death)
            self.worker = Worker(engine_config, self.parallel, placement.local_rank if placement.is_cuda else None)
            self.channel.collect(self.check_health)
        except BaseException:
            self.shutdown()
            raise

    # liveness ---------------------------------------------------------------------------------

    def _on_worker_death(self, lines: list[str]) -> None:
        """From the watch thread: record the death; on NCCL abort the group so no collective waits on it.

        ``lines`` name the ranks whose processes ended (rank, pid, exit code or signal).
        """
        self._death = "; ".join(lines or self.workers.failures())
        logger.error("tensor-parallel worker died: %s", self._death)
        self._release_waiting_kernels()
        if self.placement.is_cuda:
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort is not None:
                abort()

    def _release_waiting_kernels(self) -> None:
        """Let rank 0's one-shot all-reduces stop waiting for the workers (which are dead, or about to be killed).

        Unlike NCCL's, the symmetric-memory kernel cannot be aborted: it would wait forever for a dead
        peer's signal, and with it every later sync of this device (see ``symm_mem``).
        """
        parallel = getattr(self, "parallel", None)
        if parallel is not None and hasattr(parallel.communicator, "on_peer_death"):
            parallel.communicator.on_peer_death(list(range(1, self.world_size)))

    def check_health(self) -> None:
        if self.is_shut_down:
            raise EngineDeadError("the tensor-parallel executor was shut down")
        failures = self.workers.failures() if self.workers is not None else []
        if failures or self._death is not None or self.is_dead:
            self._die("; ".join(failures) or self._death or "an earlier step failed")

    def _die(self, reason: str, cause: BaseException | None = None) -> None:
        """Stop every rank and raise: the group cannot continue without one of its shards."""
        self.is_dead = True
        _drop_locals(cause)  # its frames would keep the runner, and so its CUDA graphs, alive
        self._stop_ranks(graceful=False)
        raise EngineDeadError(f"a tensor-parallel worker died ({reason}); restart the engine") from cause

    # the Executor contract ---------------------------------------------------------------------

    def _call_all(self, method: str, *args: Any, local=None) -> list[Any]:
        """Run ``method`` on every rank at once (rank 0 here); the results by rank."""
        self.check_health()
        self.channel.send(Call(method, args))
        try:
            mine = local() if local is not None else getattr(self.worker, method)(*args)
            return [mine, *self.channel.collect(self.check_health)]
        except EngineDeadError:
            raise
        except BaseException as e:
            self.raise_if_a_worker_died(e)
            raise

    def raise_if_a_worker_died(self, error: BaseException) -> None:
        """A failed collective usually means a worker died: wait briefly for its exit to show."""
        if self.workers is None:
            return
        deadline = time.monotonic() + CRASH_GRACE
        while time.monotonic() < deadline:
            failures = self.workers.failures()
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
        self.channel.send(Call(STEP, (scheduler_output,), reply=False))
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

    def shutdown(self) -> None:
        if self.is_shut_down:
            return
        self._stop_ranks(graceful=not self.is_dead)
        self.is_shut_down = True

    def _stop_ranks(self, graceful: bool) -> None:
        if self.workers is not None:
            self.workers.expect_exit()
        if graceful and self._death is None and self.channel is not None and dist.is_initialized():
            try:
                self.channel.send(Call(STOP))
            except RuntimeError:  # the store is gone (DistError): the workers exit on their own
                graceful = False
        if self.workers is not None and not graceful:
            self.workers.kill()
        if not graceful:
            self._release_waiting_kernels()
        # Every rank frees its graphs (they hold the NCCL communicator) and leaves the group at the
        # same time as the others: NCCL's teardown of a communicator waits for its peers, so rank 0
        # waiting for the workers' exit first would hold them until STOP_TIMEOUT killed them.
        release_worker(self)
        leave_group(abort=not graceful)
        if self.workers is not None and graceful:
            self.workers.stop(STOP_TIMEOUT)
