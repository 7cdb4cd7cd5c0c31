"""The collectives of the default process group, as the layers call them (NCCL on CUDA, gloo on the CPU)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from infer_core.interfaces import Communicator


class ProcessGroupCommunicator(Communicator):
    """``torch.distributed``'s collectives over every rank of the default group.

    Every call runs on the current stream, so it is captured into a CUDA graph like any kernel (an
    ``all_to_all`` with split sizes read from the host excepted). A strategy with a faster path of its own
    subclasses this and falls back to it.
    """

    def __init__(self, rank: int, world_size: int, backend: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        x = x.contiguous()
        if self.backend == "nccl":
            out = torch.empty((self.world_size, *x.shape), dtype=x.dtype, device=x.device)  # the ranks' x stacked
            dist.all_gather_into_tensor(out, x)
            if dim in (-1, x.dim() - 1):  # a view, no copy, where x has one row (the LM head's logits at batch 1)
                return out.movedim(0, -2).reshape(*x.shape[:-1], self.world_size * x.shape[-1])
            parts = out.unbind(0)
        else:
            parts = [torch.empty_like(x) for _ in range(self.world_size)]
            dist.all_gather(parts, x)
        return torch.cat(parts, dim=dim)

    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        x = x.contiguous()
        if self.rank != dst:
            dist.gather(x, None, dst=dst)
            return None
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.gather(x, parts, dst=dst)
        return torch.cat(parts, dim=dim)

    def all_to_all(self, x: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int]) -> torch.Tensor:
        out = torch.empty((sum(output_split_sizes), *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes, input_split_sizes)
        return out
