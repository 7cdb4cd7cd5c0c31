"""Grammar masks on the device: every logit a row's token bitmask does not allow becomes -inf, in place.

The bitmask is int32 ``[M, ceil(V / 32)]``, token ``t`` allowed when bit ``t % 32`` of word
``t // 32`` is set (interfaces/constraints.py). One launch covers the batch: a program per
(masked row, block of tokens) unpacks its words in registers, so no [M, V] mask is ever written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # tokens per program: 128 words of the bitmask


@triton.jit
def _apply_bitmask_kernel(logits_ptr, logits_stride, rows_ptr, bitmask_ptr, bitmask_stride, vocab_size, num_words,
                          BLOCK: tl.constexpr):
    mask_row = tl.program_id(0)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + mask_row).to(tl.int64)
    words = offsets // 32
    in_vocab = offsets < vocab_size
    packed = tl.load(bitmask_ptr + mask_row * bitmask_stride + words, mask=in_vocab & (words < num_words), other=0)
    allowed = ((packed >> (offsets % 32)) & 1) != 0
    minus_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * logits_stride + offsets, minus_inf, mask=in_vocab & ~allowed)


def apply_token_bitmask_(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set ``logits[rows[m], t] = -inf`` for every token ``t`` that ``bitmask[m]`` does not allow (in place).

    ``logits`` [R, V] with unit stride along V; ``rows`` [M] int64; ``bitmask`` [M, W] int32, all on one
    device. Tokens past ``32 * W`` are not allowed.
    """
    num_rows, vocab_size = rows.shape[0], logits.shape[1]
    if num_rows == 0:
        return
    grid = (num_rows, triton.cdiv(vocab_size, BLOCK))
    _apply_bitmask_kernel[grid](logits, logits.stride(0), rows, bitmask, bitmask.stride(0), vocab_size,
                                bitmask.shape[1], BLOCK=BLOCK)
