"""The tensor-parallel Executor: the core's ``RankExecutor`` (``infer_core.distributed``) with the tp group's join.

Every rank runs the same forward on its Megatron shard; the group each rank joins (``group.join_tp_group``)
sets up the symmetric-memory all-reduce and push sites where the settings ask for them.
"""

from __future__ import annotations

from typing import Any

from infer_core.distributed import RankExecutor
from infer_core.interfaces import WorkerFactory

from infer_parallel_tp.group import TP_GROUP


class TensorParallelExecutor(RankExecutor):
    """Drives every rank of one tensor-parallel group; the engine talks only to this."""

    def __init__(self, engine_config: Any, world_size: int, worker_factory: WorkerFactory) -> None:
        super().__init__(engine_config, world_size, worker_factory, TP_GROUP)
