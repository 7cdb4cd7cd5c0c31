"""One push site as the kernels see it: where a rank stores its partial sums on every rank, and who adds them.

A site's slot on a rank is ``int64 [max_rows, n / values a word]``: each 64-bit word carries 32 bits of
values (one float32, or two bfloat16 / float16 side by side) and the round of the push that wrote them
(``pushed_sums.py``). ``push_sites.py`` lays the sites out in the symmetric buffer; the pushed layers
(``pushed_layers.py``) and the communicator's all-gather hold one each. This module never imports triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WORD_DTYPE = torch.int64  # a slot's element: 32 bits of values, then the round of the push
# Who adds the pushed values (the pushed_partial_sums_mode setting): "gemv" the pushing GEMV's own last programs,
# "sum" a small kernel after the pushing GEMV, "all_reduce" one kernel that pushes the layer's stored output and
# adds every rank's (an all-reduce for any linear method's output).
PUSH_MODES = ("gemv", "sum", "all_reduce")


def values_per_word(dtype: torch.dtype) -> int:
    """Values a word of a slot carries: 1 float32, or 2 of a 16-bit dtype (bfloat16, float16)."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"partial sums are pushed in float32, bfloat16 or float16, not {dtype}")
    return 4 // dtype.itemsize


@dataclass(frozen=True, slots=True)
class PushTarget:
    """One site: a row-parallel layer's (or the embedding's) partial sums, or the LM head's logits.

    The pushing kernel stores its ``[rows, n]`` values into this rank's slot of the site on every rank
    (peer memory); the kernel that reads them waits until every rank's words there carry the round and adds
    (or, for the all-gather, copies) the slots itself. All tensors are on this rank's device; ``dest_ptrs``
    holds addresses other ranks mapped.
    """

    rank: int
    world_size: int
    dtype: torch.dtype  # of the values (float32: one a word; bfloat16, float16: two)
    n: int  # values a row
    dest_ptrs: torch.Tensor  # int64 [world]: this rank's slot of the site, on every rank
    slots: torch.Tensor  # int64 [world, max_rows, n / values a word]: every rank's slot of the site, here
    abort: torch.Tensor  # int32 [1]: nonzero once a peer died, which lets every wait through
    mode: str  # one of PUSH_MODES

    @property
    def max_rows(self) -> int:
        return self.slots.shape[1]

    def fits(self, num_rows: int, n: int, dtype: torch.dtype) -> bool:
        """Whether ``[num_rows, n]`` values of ``dtype`` fit a push into this site."""
        return dtype == self.dtype and n == self.n and 0 < num_rows <= self.slots.shape[1]


def checked_values_per_word(target: PushTarget) -> int:
    """``values_per_word`` of the target's dtype, once its slots are int64 words holding ``target.n`` values a row."""
    per_word = values_per_word(target.dtype)
    if target.slots.dtype != WORD_DTYPE or target.slots.dim() != 3 or target.slots.shape[2] * per_word != target.n:
        raise ValueError(f"push target slots {tuple(target.slots.shape)} {target.slots.dtype} do not hold "
                         f"{target.n} {target.dtype} values a row: they must be int64 [world, rows, "
                         f"{target.n // per_word}]")
    return per_word
