"""Where each rank sits and how it joins the process group: spawned by the engine, or under torchrun."""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from infer_core.interfaces import ParallelContext

from infer_parallel_tp.communicator import DistributedCommunicator
from infer_parallel_tp.settings import TPSettings

# A collective that waits this long means a rank is gone (NCCL's watchdog then aborts it). Long
# enough for the slowest step of a large model; rank 0 notices a dead spawned worker sooner
# through its process handle.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SYMM_MEM_SETTING = "enable_symm_mem_all_reduce"

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RankPlacement:
    """One rank of the tensor-parallel group: its index, the group's size, its device."""

    rank: int
    world_size: int
    local_rank: int  # CUDA device index on its host
    backend: str  # "nccl" (CUDA) or "gloo" (CPU)

    @property
    def is_cuda(self) -> bool:
        return self.backend == "nccl"


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


def symm_mem_all_reduce_enabled(settings) -> bool:
    """The plugin's ``enable_symm_mem_all_reduce`` setting (``TPSettings``; off by default)."""
    return TPSettings.of(settings).enable_symm_mem_all_reduce


def push_layout_for(config, world_size: int):
    """The push sites for the engine's model (``push_sites.PushLayout``), or None: pushes off, or nothing to push.

    ``enable_pushed_partial_sums`` (with ``enable_symm_mem_all_reduce``): the strategy's ``prepare_model`` then
    swaps in the pushing layers (``pushed_layers.py``), the mode (``pushed_partial_sums_mode``) saying who adds.
    """
    settings = TPSettings.of(config.settings)
    if not (settings.enable_symm_mem_all_reduce and settings.enable_pushed_partial_sums):
        return None
    from infer_core.layers.embedding import vocab_rows_per_rank

    from infer_parallel_tp.push_sites import PushLayout

    model = config.model
    return PushLayout.for_model(model.num_layers, model.hidden_size, world_size, getattr(torch, config.dtype),
                                mode=settings.pushed_partial_sums_mode,
                                vocab_rows=vocab_rows_per_rank(model.vocab_size, world_size))


def join_group(placement: RankPlacement, store: dist.Store, *, enable_symm_mem: bool,
               push_layout=None) -> ParallelContext:
    """Initialise the default process group on ``store``; the layers' ParallelContext for this rank.

    On CUDA, with ``enable_symm_mem``, every rank then sets up the one-shot all-reduce together
    (or falls back to NCCL together), with the sites of ``push_layout`` (``push_layout_for``) if given,
    and says once which all-reduce the group uses.
    """
    if dist.is_initialized():
        raise RuntimeError(
            "a torch.distributed process group already exists in this process; one tensor-parallel engine per "
            "process: shut the other one down first (llm.shutdown(), or drop every reference to it)"
        )
    if placement.is_cuda:
        torch.cuda.set_device(placement.local_rank)
    dist.init_process_group(
        placement.backend,
        store=dist.PrefixStore("tp/group", store),
        rank=placement.rank,
        world_size=placement.world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    one_shot, path = None, placement.backend
    if placement.is_cuda and placement.world_size > 1:
        if enable_symm_mem:
            from infer_parallel_tp.symm_mem import OneShotAllReduce

            one_shot, why = OneShotAllReduce.setup(placement.rank, placement.world_size, placement.local_rank,
                                                   push_layout=push_layout)
            path = f"{why}, NCCL above" if one_shot is not None else f"NCCL (no symmetric memory: {why})"
            if one_shot is not None and placement.rank == 0:
                logger.warning("%s=True: the one-shot and pushed kernels wait on peers in a way NCCL's abort cannot "
                               "stop; a worker that dies mid-step is released by this plugin's rescue instead, which "
                               "is tested less than NCCL's path: leave it off where a dead worker must surface as an "
                               "error", SYMM_MEM_SETTING)
        else:
            path = f"NCCL ({SYMM_MEM_SETTING}=False)"
        log = logger.info if placement.rank == 0 else logger.debug
        log("tensor-parallel all-reduce: %s", path)
    push_sites = one_shot.push_sites if one_shot is not None else None
    communicator = DistributedCommunicator(placement.rank, placement.world_size, placement.backend, one_shot, path,
                                           push_sites)
    return ParallelContext(placement.rank, placement.world_size, communicator)


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
