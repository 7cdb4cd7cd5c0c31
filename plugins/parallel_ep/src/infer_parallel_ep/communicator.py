"""The expert-parallel group's collectives: the core's over the default process group, with the load counters."""

from __future__ import annotations

from typing import Any

from infer_core.distributed import ProcessGroupCommunicator
from infer_core.interfaces import ParallelMetric

from infer_parallel_ep.load import ExpertLoad


class ExpertParallelCommunicator(ProcessGroupCommunicator):
    """``ProcessGroupCommunicator`` plus this rank's :class:`ExpertLoad` (every dispatch adds to it)."""

    def __init__(self, rank: int, world_size: int, backend: str, num_experts: int) -> None:
        super().__init__(rank, world_size, backend)
        self.load = ExpertLoad(num_experts, world_size)

    def describe(self) -> dict[str, Any]:
        return {"path": f"{self.backend} all-to-all", **self.load.describe()}

    def metrics(self) -> list[ParallelMetric]:
        return self.load.metrics()
