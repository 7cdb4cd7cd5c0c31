"""How a tensor-parallel rank joins the process group: the core's join, then (on CUDA, when asked) the
one-shot all-reduce over symmetric memory and the push sites, set up with every rank.

The rank machinery (placement, spawned workers, executor, leaving the group) is the core's
``infer_core.distributed``; this module is the ``GroupJoin`` the tp strategy gives it (:func:`join_tp_group`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from infer_core.distributed import (
    COLLECTIVE_TIMEOUT,
    GroupSpec,
    RankPlacement,
    join_process_group,
    leave_group,
    torchrun_placement,
    torchrun_store,
)
from infer_core.interfaces import ParallelContext

from infer_parallel_tp.communicator import DistributedCommunicator
from infer_parallel_tp.settings import TPSettings

SYMM_MEM_SETTING = "enable_symm_mem_all_reduce"

logger = logging.getLogger(__name__)

# re-exported: the tests and the symmetric-memory GPU check start ranks with these
__all__ = ["COLLECTIVE_TIMEOUT", "TP_GROUP", "join_group", "join_tp_group", "leave_group", "torchrun_placement",
           "torchrun_store"]


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
    join_process_group(placement, store)
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


def join_tp_group(placement: RankPlacement, store: dist.Store, engine_config: Any) -> ParallelContext:
    """The tp strategy's ``GroupJoin``: :func:`join_group` with the engine's settings (on every rank)."""
    return join_group(placement, store, enable_symm_mem=symm_mem_all_reduce_enabled(engine_config.settings),
                      push_layout=push_layout_for(engine_config, placement.world_size))


TP_GROUP = GroupSpec("tensor-parallel", join_tp_group, "infer_parallel_tp.launch")
