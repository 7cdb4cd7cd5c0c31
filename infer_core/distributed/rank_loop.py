"""The loop of every rank but 0: receive a call from rank 0, run it on this rank's worker, repeat.

Spawned by the engine (``spawn_main``), or started by torchrun for ranks > 0 (a strategy's launch module
calls ``torchrun_entry``). Rank 0 sends, with INIT, the engine's configuration, the factory of a rank's worker
(``interfaces.WorkerFactory``: the core's ``Worker`` class, pickled by name) and the strategy's ``GroupSpec``
(how a rank joins the group and builds its ``ParallelContext``), so this module builds the core's worker
without importing the runner, and any strategy's ranks without knowing the strategy. Any failure ends the process: a rank in an unknown state
must not take part in collectives; rank 0 sees the exit and reports the engine dead, quoting what
this rank last wrote to stderr.

A step (``STEP``) is launched and not waited for: its sampled tokens stay on this rank's device,
where the next step reads its pending tokens, and nobody reads them on the host. This rank's host
then runs ahead of its device no further than rank 0's: rank 0 sends step N+1 only after it has
read step N-1, which the collectives tie to this rank's step N-1.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from dataclasses import replace

import torch
import torch.distributed as dist

from infer_core.distributed.channel import WorkerChannel
from infer_core.distributed.group import (
    COLLECTIVE_TIMEOUT,
    GroupSpec,
    RankPlacement,
    backend_for,
    leave_group,
    release_worker,
    torchrun_placement,
    torchrun_store,
)
from infer_core.interfaces import WorkerFactory

logger = logging.getLogger(__name__)

STOP = "stop"
INIT = "init"  # take the engine's configuration, the worker factory and the GroupSpec, get ready to join the group
JOIN = "join"  # join the process group with every other rank, then build this rank's worker
STEP = "step"  # launch one SchedulerOutput; no reply


def _exit_with_parent(parent_pid: int) -> None:
    """A spawned worker must not outlive the engine's process (it would hold its GPU)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(1.0)


class RankLoop:
    """This rank's worker, driven by the calls rank 0 sends."""

    def __init__(self, placement: RankPlacement, channel: WorkerChannel) -> None:
        self.placement = placement
        self.channel = channel
        self.worker = None
        self.config = None
        self.worker_factory: WorkerFactory | None = None
        self.spec: GroupSpec | None = None

    def _init(self, config, worker_factory: WorkerFactory, spec: GroupSpec) -> None:
        """Take the engine's configuration and set up this rank's device: a rank that cannot is reported
        before the others wait for it in the group's rendezvous, which no death interrupts."""
        self.config, self.worker_factory, self.spec = config, worker_factory, spec
        self.placement = replace(self.placement, backend=backend_for(config.device))
        if self.placement.is_cuda:
            torch.cuda.set_device(self.placement.local_rank)
        else:
            torch.set_num_threads(1)  # the ranks share the host's cores

    def _join(self, store: dist.Store) -> None:
        """Join the group with the engine's device, then build this rank's worker."""
        config = self.config
        parallel = self.spec.join(self.placement, store, config)
        local_device = self.placement.local_rank if self.placement.is_cuda else None
        self.worker = self.worker_factory(config, parallel, local_device)

    @property
    def _name(self) -> str:
        return self.spec.name if self.spec is not None else "worker"

    def run(self, store: dist.Store) -> int:
        self.channel.reply(True, os.getpid())  # up: rank 0 sends INIT once every rank is, JOIN once every rank took it
        failed, holds_gc = True, False
        try:
            while True:
                call = self.channel.receive()
                if call.method == STOP:
                    failed = False
                    self.channel.reply(True, None)
                    return 0
                try:
                    result = None
                    if call.method == STEP:
                        self.worker.execute_async(*call.args)  # the result is never read on this rank
                    elif call.method == INIT:
                        self._init(*call.args)
                    elif call.method == JOIN:
                        self._join(store)
                        # a worker rank serves steps from here to STOP: its start-up heap is frozen, as rank 0's
                        # is while its engine is busy (a full GC pass here would stall every rank at a collective)
                        self.worker.hold_gc()
                        holds_gc = True
                    else:
                        result = getattr(self.worker, call.method)(*call.args)
                except BaseException:  # noqa: BLE001 - any failure ends this rank, reported to rank 0
                    text = traceback.format_exc()
                    logger.error("%s rank %d: %s failed:\n%s", self._name, self.placement.rank, call.method, text)
                    if call.reply:
                        self.channel.reply(False, text)
                    return 1
                if call.reply:
                    self.channel.reply(True, result)
        except dist.DistNetworkError:
            logger.error("%s rank %d: lost rank 0's store; exiting", self._name, self.placement.rank)
            return 1
        finally:
            if holds_gc:
                self.worker.release_gc()
            release_worker(self)  # its CUDA graphs hold the NCCL communicator
            leave_group(abort=failed)


def spawn_main(argv: list[str]) -> int:
    """A spawned worker (``processes.ENTRY``): connect to rank 0's store and serve calls; the exit code.

    ``argv``: rank, world size, local rank, backend, store host, store port, the engine's pid.
    """
    rank, world_size, local_rank, backend, host, port, parent_pid = argv
    placement = RankPlacement(int(rank), int(world_size), int(local_rank), backend)
    logging.basicConfig(level=logging.INFO, format=f"[rank {placement.rank}] %(levelname)s %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(int(parent_pid),), daemon=True).start()
    store = dist.TCPStore(host, int(port), None, False, COLLECTIVE_TIMEOUT)
    return RankLoop(placement, WorkerChannel(store, placement.rank)).run(store)


def torchrun_entry() -> int:
    """A rank > 0 under torchrun: join rank 0 through the env:// store and serve calls."""
    placement = torchrun_placement("cpu")  # the backend follows the engine's device, sent with INIT
    if placement is None:
        raise RuntimeError("torchrun_entry needs torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT")
    store = torchrun_store(placement)
    return RankLoop(placement, WorkerChannel(store, placement.rank)).run(store)
