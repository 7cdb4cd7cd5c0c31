"""How an expert-parallel rank joins the process group: the core's join, then a context whose mixture-of-experts
layers hold whole experts (``ParallelContext.expert_parallel``) and whose communicator counts the load."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from infer_core.distributed import GroupSpec, RankPlacement, join_process_group
from infer_core.interfaces import ParallelContext

from infer_parallel_ep.communicator import ExpertParallelCommunicator
from infer_parallel_ep.settings import EPSettings


def join_ep_group(placement: RankPlacement, store: dist.Store, engine_config: Any) -> ParallelContext:
    """The ep strategy's ``GroupJoin`` (on every rank)."""
    join_process_group(placement, store)
    communicator = ExpertParallelCommunicator(placement.rank, placement.world_size, placement.backend,
                                              engine_config.model.moe.num_experts,
                                              EPSettings.of(engine_config.settings).expert_parallel_dispatch)
    return ParallelContext(placement.rank, placement.world_size, communicator, expert_parallel=True)


EP_GROUP = GroupSpec("expert-parallel", join_ep_group)  # spawned ranks only, not under torchrun
