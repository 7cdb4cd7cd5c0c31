"""Vocabulary-parallel token embedding and LM head.

Each rank holds a contiguous slice of the (padded) vocabulary. The embedding zeroes tokens
outside its slice and all-reduces; the LM head all-gathers its logits slices, so every rank samples.
Where the communicator offers a push site (GPUs with symmetric memory, decode-sized batches) the
lookup, the zeroing and the all-reduce are one launch (``fused/pushed_sums.lookup_all_reduce``), and
so is the LM head's all-gather (``all_gather_pushed``: no NCCL launch in a decode step's graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.interfaces import ParallelContext
from infer_core.layers import fused
from infer_core.layers.fused.dense import GEMV_DTYPES, dense_linear

PAD_MULTIPLE = 64
PUSH_SITE = "embed_tokens"  # the push site the embedding asks for (its model's first, as it runs first)


def vocab_rows_per_rank(vocab_size: int, world_size: int) -> int:
    """Rows of the embedding and LM head one rank holds: the vocabulary padded to 64 per rank, split evenly."""
    multiple = PAD_MULTIPLE * world_size if world_size > 1 else 1
    return -(-vocab_size // multiple) * multiple // world_size


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, *, parallel: ParallelContext, dtype: torch.dtype) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.parallel = parallel
        self.num_per_rank = vocab_rows_per_rank(vocab_size, parallel.world_size)
        self.vocab_start = parallel.rank * self.num_per_rank
        self.vocab_end = min(self.vocab_start + self.num_per_rank, vocab_size)
        self.weight = nn.Parameter(torch.empty(self.num_per_rank, hidden_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        rows = loaded[self.vocab_start : self.vocab_end]
        param.data[: rows.shape[0]].copy_(rows)
        param.data[rows.shape[0] :].zero_()

    def checkpoint_shapes(self, param: nn.Parameter) -> list[tuple[None, tuple[int, ...]]]:
        """The full checkpoint tensor ``weight_loader`` takes this rank's rows from (for dummy weights)."""
        return [(None, (self.vocab_size, param.shape[1]))]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.world_size == 1:
            return F.embedding(input_ids, self.weight)
        target = None
        if input_ids.dim() == 1 and input_ids.is_cuda:
            target = self.parallel.communicator.push_target(PUSH_SITE, input_ids.shape[0], self.weight.shape[1],
                                                            self.weight.dtype)
        if target is not None:
            from infer_core.layers.fused.pushed_sums import lookup_all_reduce

            return lookup_all_reduce(input_ids, self.weight, self.vocab_start, self.vocab_end, target)
        in_range = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(in_range, input_ids - self.vocab_start, 0)
        out = F.embedding(local, self.weight) * in_range.unsqueeze(-1).to(self.weight.dtype)
        return self.parallel.communicator.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over this rank's vocabulary slice, all-gathered: every rank gets the whole row, bitwise
    identical, and samples the same tokens (the next step reads them on each rank's device)."""

    def __init__(self, vocab_size, hidden_size, *, parallel, dtype, tied_to: VocabParallelEmbedding | None = None):
        super().__init__(vocab_size, hidden_size, parallel=parallel, dtype=dtype)
        if tied_to is not None:
            self.weight = tied_to.weight
        self.gemv = self.weight.dtype in GEMV_DTYPES and fused.runs_triton(fused.GEMV, self.weight.device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # the dense layers' matmul (our GEMV at decode sizes where built for it); this rank's vocabulary
        # slice, tied to the embedding or not
        logits = dense_linear(hidden, self.weight, None, self.gemv)
        if self.parallel.world_size > 1:
            logits = self._all_gather(logits)
        return logits[..., : self.vocab_size]

    def _all_gather(self, logits: torch.Tensor) -> torch.Tensor:
        communicator = self.parallel.communicator
        target = None
        if logits.dim() == 2 and logits.is_cuda:
            target = communicator.gather_target(logits.shape[0], logits.shape[1], logits.dtype)
        if target is None:
            return communicator.all_gather(logits, dim=-1)
        from infer_core.layers.fused.pushed_sums import all_gather_pushed

        return all_gather_pushed(logits, target)
