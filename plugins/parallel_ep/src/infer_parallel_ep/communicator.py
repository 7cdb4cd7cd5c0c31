"""The expert-parallel group's collectives: the core's over the default process group, the token slices' own, and
the load counters."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from infer_core.distributed import ProcessGroupCommunicator
from infer_core.interfaces import ParallelMetric

from infer_parallel_ep.load import ExpertLoad

# torch renamed reduce_scatter_tensor and all_gather_into_tensor (NCCL and gloo alike); the old names warn where
# the new ones exist
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class ExpertParallelCommunicator(ProcessGroupCommunicator):
    """``ProcessGroupCommunicator`` plus the token slices' reduce-scatter and all-gather (equal chunks along the
    first dim) and this rank's :class:`ExpertLoad` (each all-to-all dispatch, or rank 0's routing under
    ``all_reduce``, adds to it)."""

    def __init__(self, rank: int, world_size: int, backend: str, num_experts: int,
                 dispatch: str = "all_reduce") -> None:
        super().__init__(rank, world_size, backend)
        self.dispatch = dispatch
        self.load = ExpertLoad(num_experts, world_size)

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``x`` [ranks x rows, ...], this rank's ``rows`` of it (equal chunks, rank by rank)."""
        out = torch.empty((x.shape[0] // self.world_size, *x.shape[1:]), dtype=x.dtype, device=x.device)
        _REDUCE_SCATTER(out, x.contiguous())
        return out

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` [rows, ...], rank by rank: [ranks x rows, ...], gathered in place (no concatenation)."""
        x = x.contiguous()
        out = torch.empty((self.world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        _ALL_GATHER(out, x)
        return out

    def describe(self) -> dict[str, Any]:
        return {"path": f"{self.backend} {self.dispatch}", **self.load.describe()}

    def metrics(self) -> list[ParallelMetric]:
        return self.load.metrics()
