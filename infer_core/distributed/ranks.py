"""What one multi-rank executor holds that must be let go of, and letting go of it, once.

``Ranks`` owns the worker processes, the control channel and its store, rank 0's worker and rank
0's membership of the process group. The executor registers ``Ranks.close`` with
``weakref.finalize``, and nothing here refers back to the executor (the death watch calls
``Ranks.on_worker_death``), so an engine that is dropped (``del llm``), collected out of a
reference cycle, or still alive at interpreter exit stops its workers and leaves the process group
as ``shutdown()`` does, and the next multi-rank engine of the process can join a new one.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

from infer_core.distributed.channel import Call, LeaderChannel
from infer_core.distributed.group import GroupSpec, RankPlacement, leave_group, release_worker
from infer_core.distributed.processes import SpawnedWorkers
from infer_core.distributed.rank_loop import STOP

logger = logging.getLogger(__name__)

STOP_TIMEOUT = 10.0  # seconds a graceful stop waits for workers to exit before killing them


class Ranks:
    """The ranks of one executor: ``workers`` (None under torchrun, whose ranks > 0 are not ours to stop)."""

    def __init__(self, placement: RankPlacement, store: dist.Store, workers: SpawnedWorkers | None,
                 spec: GroupSpec) -> None:
        self.placement = placement
        self.spec = spec
        self.store = store
        self.workers = workers
        self.channel = LeaderChannel(store, placement.world_size)
        self.worker = None  # rank 0's worker, once built (``release_worker`` frees it)
        self.parallel = None  # rank 0's ParallelContext, once in the group
        self.group = None  # the default process group while this executor's rank 0 is in it
        self.death: str | None = None  # set by the watch thread: how the workers that died ended
        self.is_stopped = False

    def join(self, engine_config) -> None:
        """Rank 0 joins the process group (the workers do so on JOIN)."""
        self.parallel = self.spec.join(self.placement, self.store, engine_config)
        self.group = dist.group.WORLD

    def _holds_group(self) -> bool:
        """Whether the process's default group is still the one this executor joined (not left, not
        aborted, and so not another engine's that joined since)."""
        return self.group is not None and dist.is_initialized() and dist.group.WORLD is self.group

    def on_worker_death(self, lines: list[str]) -> None:
        """From the watch thread: record the death; on NCCL abort the group so no collective waits on it.

        ``lines`` name the ranks whose processes ended (rank, pid, exit code or signal).
        """
        if self.death is not None or self.is_stopped:
            return
        self.death = "; ".join(lines or self.workers.failures())
        logger.error("%s worker died: %s", self.spec.name, self.death)
        self.release_waiting_kernels()
        if self.placement.is_cuda and self._holds_group():
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort is not None:
                abort()
                self.group = None

    def release_waiting_kernels(self) -> None:
        """Let rank 0's kernels that wait on peers stop waiting for the workers (dead, or about to be killed).

        A communicator with such kernels (the tp plugin's one-shot all-reduce over symmetric memory, which
        NCCL's abort cannot stop) has ``on_peer_death(dead_ranks)``; it is called here.
        """
        parallel = self.parallel
        if parallel is not None and hasattr(parallel.communicator, "on_peer_death"):
            parallel.communicator.on_peer_death(list(range(1, self.placement.world_size)))

    def stop(self, graceful: bool) -> None:
        """Stop every rank and free rank 0's share; only the first call does anything.

        Graceful: the workers are sent STOP and given STOP_TIMEOUT s to exit; otherwise (a rank
        died, or STOP cannot be sent) they are killed and the group is aborted rather than destroyed.
        """
        if self.is_stopped:
            return
        self.is_stopped = True
        graceful = graceful and self.death is None
        if self.workers is not None and not self._holds_group():
            graceful = False  # rank 0 is not in the group: a worker may be waiting in the join for it
        if self.workers is not None:
            self.workers.expect_exit()
        if graceful:
            try:
                self.channel.send(Call(STOP))
            except RuntimeError:  # the store is gone (DistError): the workers exit on their own
                graceful = False
        if self.workers is not None and not graceful:
            self.workers.kill()
        if not graceful:
            self.release_waiting_kernels()
        # Every rank frees its graphs (they hold the NCCL communicator) and leaves the group at the
        # same time as the others: NCCL's teardown of a communicator waits for its peers, so rank 0
        # waiting for the workers' exit first would hold them until STOP_TIMEOUT killed them.
        release_worker(self)
        if self._holds_group():
            leave_group(abort=not graceful)
        self.group = None
        self.parallel = None
        if self.workers is not None and graceful:
            self.workers.stop(STOP_TIMEOUT)

    def close(self) -> None:
        """``stop`` as ``shutdown()`` does it: gracefully unless a rank died. Idempotent."""
        self.stop(graceful=True)
