"""Collectives of one tensor-parallel group over ``torch.distributed`` (NCCL on CUDA, gloo on CPU), with the
symmetric-memory fast paths where the group set them up."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from infer_core.distributed import ProcessGroupCommunicator

if TYPE_CHECKING:
    from infer_parallel_tp.push_sites import PushSites
    from infer_parallel_tp.symm_mem import OneShotAllReduce

logger = logging.getLogger(__name__)


class DistributedCommunicator(ProcessGroupCommunicator):
    """The default process group's collectives (the core's ``ProcessGroupCommunicator``), as the layers call them.

    Every call runs on the current stream, so it is captured into a CUDA graph like any kernel.
    All-reduces of small bfloat16/float32 tensors take ``one_shot`` (symmetric memory, see
    ``symm_mem``) when the group set it up, the rest the backend's (NCCL or gloo); the choice
    depends only on the tensor's dtype, size and layout, so every rank makes the same one.
    ``all_reduce_path`` says why one-shot is not used, when it is not.

    ``push_sites`` (``enable_pushed_partial_sums``): the sites the strategy's pushing layers take
    (``pushed_layers.py``), and the LM head's gather site, which :meth:`all_gather` uses for logits that fit
    it (CUDA, ``[rows, n]``, at most its rows): one launch that pushes and copies every rank's
    (``all_gather_pushed``), no NCCL launch. That site is one site: between two of its all-gathers must come
    a collective (a model's layers all-reduce between two LM heads), so that every rank has read the last.
    """

    def __init__(self, rank: int, world_size: int, backend: str, one_shot: OneShotAllReduce | None = None,
                 all_reduce_path: str = "", push_sites: PushSites | None = None) -> None:
        super().__init__(rank, world_size, backend)
        self.one_shot = one_shot
        self.all_reduce_path = all_reduce_path or backend
        self.push_sites = push_sites
        self.gather_site = push_sites.gather if push_sites is not None else None
        if self.gather_site is not None:
            from infer_parallel_tp.push_all_reduce import all_gather_pushed

            self._all_gather_pushed = all_gather_pushed
        self.num_one_shot = 0  # calls issued down each path (a captured call counts once, not per replay)
        self.num_fallback = 0
        self.num_gathers_pushed = 0  # all-gathers through the gather site
        self._noted: set[str] = set()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        one_shot = self.one_shot
        if one_shot is not None:
            reason = one_shot.unsuitable(x)
            if reason is None:
                self.num_one_shot += 1
                return one_shot(x)
            if reason != "size" and reason not in self._noted:
                self._noted.add(reason)
                logger.info("all-reduce of %s takes %s, not the one-shot kernel", reason, self.backend)
        self.num_fallback += 1
        return super().all_reduce(x)

    def describe(self) -> dict[str, Any]:
        """Which all-reduce ran: the path chosen at start, its size limit, and the calls down each path
        (``num_pushed``: the pushing layers' calls that pushed; ``num_sites_pushed``: of the sites they took,
        ``num_push_sites``, those that pushed at least once)."""
        sites = self.push_sites
        return {
            "path": self.all_reduce_path,
            "one_shot_max_bytes": self.one_shot.max_bytes if self.one_shot is not None else 0,
            "num_one_shot": self.num_one_shot,
            "num_pushed": sum(sites.pushes) if sites is not None else 0,
            "num_push_sites": sites.num_taken if sites is not None else 0,
            "num_sites_pushed": sites.num_sites_pushed if sites is not None else 0,
            "num_gathers_pushed": self.num_gathers_pushed,
            f"num_{self.backend}": self.num_fallback,
        }

    def on_peer_death(self, dead_ranks: list[int]) -> None:
        """A peer is gone: let this rank's waiting one-shot kernels through, and stop using them.

        The rescuer (``OneShotAllReduce.rescue_after_peer_death``) then holds, and in the end frees,
        the symmetric buffer, whose release syncs the device.
        """
        one_shot, self.one_shot = self.one_shot, None
        if one_shot is not None:
            one_shot.rescue_after_peer_death(dead_ranks)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        gather = self.gather_site
        if (gather is not None and x.dim() == 2 and dim in (-1, 1) and x.is_cuda and x.stride(-1) == 1
                and gather.fits(x.shape[0], x.shape[1], x.dtype)):
            self.num_gathers_pushed += 1
            return self._all_gather_pushed(x, gather)
        return super().all_gather(x, dim)
