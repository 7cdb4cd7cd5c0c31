"""Vocabulary-parallel token embedding and LM head.

Each rank holds a contiguous slice of the (padded) vocabulary. The embedding zeroes tokens
outside its slice and all-reduces; the LM head all-gathers its logits slices, so every rank samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infer_core.interfaces import ParallelContext
from infer_core.layers import cpu_matmul, fused
from infer_core.layers.fused.dense import GEMV_DTYPES, dense_linear

PAD_MULTIPLE = 64


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
        in_range = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(in_range, input_ids - self.vocab_start, 0)
        out = F.embedding(local, self.weight) * in_range.unsqueeze(-1).to(self.weight.dtype)
        return self.parallel.communicator.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over this rank's vocabulary slice, all-gathered: every rank gets the whole row, bitwise
    identical, and samples the same tokens (the next step reads them on each rank's device).

    The matmul is the dense layers' (``layers/unquantized.py``): our GEMV at decode sizes where built for
    it, and on the CPU the packed GEMM on a copy of the weight packed after the load (``process_after_load``;
    a tied weight stays the embedding's too)."""

    def __init__(self, vocab_size, hidden_size, *, parallel, dtype, tied_to: VocabParallelEmbedding | None = None):
        super().__init__(vocab_size, hidden_size, parallel=parallel, dtype=dtype)
        if tied_to is not None:
            self.weight = tied_to.weight
        self.gemv = self.weight.dtype in GEMV_DTYPES and fused.runs_triton(fused.GEMV, self.weight.device)
        self.packs = not self.gemv and cpu_matmul.packs(self.weight)
        self.packed: cpu_matmul.PackedWeight | None = None

    def process_after_load(self) -> None:
        """Called once every weight is loaded (``models/weights.py``)."""
        if self.packs:
            self.packed = cpu_matmul.pack(self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # this rank's vocabulary slice, tied to the embedding or not
        if self.packed is not None:
            logits = cpu_matmul.packed_linear(hidden, self.packed, None)
        else:
            logits = dense_linear(hidden, self.weight, None, self.gemv)
        if self.parallel.world_size > 1:
            logits = self.parallel.communicator.all_gather(logits, dim=-1)
        return logits[..., : self.vocab_size]
