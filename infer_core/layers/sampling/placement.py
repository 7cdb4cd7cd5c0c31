"""Sampled tokens into the next step's inputs, in one launch: ``input_ids[dst] = sampled[src]``.

Under overlapped scheduling a decode step is built before the previous step's tokens reach the
host, so its input ids take them on the device. In torch that is an ``index_select``, a cast to
the inputs' int32, and an ``index_put_`` (which converts its int32 indices to int64 first): three
or four small kernels per step. This kernel gathers, casts and scatters at once. Importing this
module imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024  # rows per loop iteration


@triton.jit
def _place_kernel(input_ids_ptr, dst_ptr, sampled_ptr, src_ptr, num_rows, BLOCK: tl.constexpr):
    for first in range(0, num_rows, BLOCK):
        rows = first + tl.arange(0, BLOCK)
        valid = rows < num_rows
        dst = tl.load(dst_ptr + rows, mask=valid, other=0)
        src = tl.load(src_ptr + rows, mask=valid, other=0)
        tokens = tl.load(sampled_ptr + src, mask=valid, other=0)
        tl.store(input_ids_ptr + dst, tokens.to(input_ids_ptr.dtype.element_ty), mask=valid)


def place_tokens(input_ids: torch.Tensor, dst: torch.Tensor, sampled: torch.Tensor, src: torch.Tensor) -> None:
    """``input_ids[dst[i]] = sampled[src[i]]`` for every i (indices int32 or int64, all on one device)."""
    assert dst.shape == src.shape and dst.dim() == 1, (dst.shape, src.shape)
    if len(dst):
        _place_kernel[(1,)](input_ids, dst, sampled, src, len(dst), BLOCK=_BLOCK, num_warps=4)
