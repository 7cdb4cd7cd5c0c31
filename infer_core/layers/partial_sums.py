"""A row-parallel layer's output before its all-reduce: every rank's partial sums, pushed here, not yet added.

``RowParallelLinear(x, defer_reduce=True)`` returns one where the communicator gives the layer a
``PushTarget`` of mode ``fused`` (tensor parallelism over symmetric memory, decode-sized batches), and a
plain tensor elsewhere (in mode ``gemv`` the sum, added by the pushing GEMV's last programs; in modes
``sum`` and ``all_reduce`` by a small kernel). The next
norm + GEMV adds the partial sums in its own prologue (``fused/norm_gemv.py``); any other reader calls
:func:`reduced`, one small kernel that waits for every rank and adds them (``fused/pushed_sums.py``).
This module never imports triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from infer_core.interfaces import PushTarget

WORD_DTYPE = torch.int64  # a slot's element: 32 bits of values, then the round of the push (``fused/pushed_sums.py``)


def values_per_word(dtype: torch.dtype) -> int:
    """Values a word of a slot carries: 1 float32, or 2 of a 16-bit dtype (bfloat16, float16)."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"partial sums are pushed in float32, bfloat16 or float16, not {dtype}")
    return 4 // dtype.itemsize


def checked_values_per_word(target: PushTarget) -> int:
    """``values_per_word`` of the target's dtype, once its slots are int64 words holding ``target.n`` values a row."""
    per_word = values_per_word(target.dtype)
    if target.slots.dtype != WORD_DTYPE or target.slots.dim() != 3 or target.slots.shape[2] * per_word != target.n:
        raise ValueError(f"push target slots {tuple(target.slots.shape)} {target.slots.dtype} do not hold "
                         f"{target.n} {target.dtype} values a row: they must be int64 [world, rows, "
                         f"{target.n // per_word}]")
    return per_word


@dataclass(frozen=True, slots=True)
class PartialSums:
    """``[*shape]`` = sum over ranks of the values in ``target.slots[r, :num_rows]``, once every rank has pushed."""

    target: PushTarget
    shape: tuple[int, ...]  # of the sum: the layer input's leading dims, then N

    @property
    def num_rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    @property
    def device(self) -> torch.device:
        return self.target.slots.device

    def sum(self) -> torch.Tensor:
        """The all-reduced tensor, in a new tensor (waits on the device for every rank's push)."""
        from infer_core.layers.fused.pushed_sums import sum_pushed

        return sum_pushed(self.target, self.num_rows).view(self.shape)


def reduced(x: torch.Tensor | PartialSums) -> torch.Tensor:
    """x itself, or the sum of its partial sums."""
    return x.sum() if isinstance(x, PartialSums) else x
