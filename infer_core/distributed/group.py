"""Where each rank sits and how it joins and leaves the process group: spawned by the engine, or under torchrun.

What a strategy adds on top (its communicator, a fast path set up with every rank) is its ``GroupJoin``: a
picklable function that calls :func:`join_process_group` and returns the rank's ``ParallelContext``. It runs on
rank 0 in the engine's process and on every worker, so every rank gets the same kind of context.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from infer_core.interfaces import ParallelContext

# A collective that waits this long means a rank is gone (NCCL's watchdog then aborts it). Long
# enough for the slowest step of a large model; rank 0 notices a dead spawned worker sooner
# through its process handle.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, slots=True)
class RankPlacement:
    """One rank of the group: its index, the group's size, its device."""

    rank: int
    world_size: int
    local_rank: int  # CUDA device index on its host
    backend: str  # "nccl" (CUDA) or "gloo" (CPU)

    @property
    def is_cuda(self) -> bool:
        return self.backend == "nccl"


class GroupJoin(Protocol):
    """``join(placement, store, engine_config) -> ParallelContext``: this rank joins the group (through
    :func:`join_process_group`) and builds the context its layers shard by. Picklable: a module-level function,
    sent to every spawned worker."""

    def __call__(self, placement: RankPlacement, store: dist.Store, engine_config: Any) -> ParallelContext:
        ...


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What a strategy tells the rank machinery: its ``name`` in messages and logs ("tensor-parallel"), how a
    rank joins (``join``), and the module torchrun runs on ranks > 0 (``torchrun_module``, for the message
    that says how to start them; None: the strategy's ranks are spawned only, not run under torchrun)."""

    name: str
    join: GroupJoin
    torchrun_module: str | None = None


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def torchrun_placement(device: str) -> RankPlacement | None:
    """This process's place when launched by torchrun (RANK, WORLD_SIZE, … set), else None."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return None
    return RankPlacement(
        int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]), backend_for(device)
    )


def torchrun_store(placement: RankPlacement) -> dist.Store:
    """The env:// rendezvous store torchrun set up (its agent's TCPStore, or one on MASTER_ADDR)."""
    store, _, _ = next(dist.rendezvous("env://", placement.rank, placement.world_size, timeout=COLLECTIVE_TIMEOUT))
    return store


def join_process_group(placement: RankPlacement, store: dist.Store) -> None:
    """Initialise the default process group on ``store`` (this rank's CUDA device set first)."""
    if dist.is_initialized():
        raise RuntimeError(
            "a torch.distributed process group already exists in this process; one multi-rank engine per "
            "process: shut the other one down first (llm.shutdown(), or drop every reference to it)"
        )
    if placement.is_cuda:
        torch.cuda.set_device(placement.local_rank)
    dist.init_process_group(
        placement.backend,
        store=dist.PrefixStore("ranks/group", store),
        rank=placement.rank,
        world_size=placement.world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )


def leave_group(*, abort: bool = False) -> None:
    """Destroy the process group; after a rank died, abort it instead (NCCL could wait on the dead)."""
    if not dist.is_initialized():
        return
    abort_group = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort and abort_group is not None and dist.get_backend() == "nccl":
        abort_group()
        return
    dist.destroy_process_group()


def release_worker(owner) -> None:
    """Free ``owner.worker`` (model, KV cache, CUDA graphs) and set it to None; call before ``leave_group``.

    NCCL neither destroys nor aborts a communicator while a CUDA graph that captured one of its
    collectives is alive, so leaving the group first would wait forever. Nothing but ``owner``
    may hold the worker (hence the owner, not the worker, is passed). No device sync: a graph
    still running is freed by CUDA when it completes, and after a failure a sync could wait on a
    collective whose peer is dead.
    """
    if owner.worker is None:
        return
    owner.worker.shutdown()
    owner.worker = None
    gc.collect()  # the runner and its graphs may sit in reference cycles
