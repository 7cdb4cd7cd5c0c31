"""Grammar masks on logits (``SamplingBatch.allowed``): the kernel on CUDA, torch elsewhere.

Imports no triton: the kernel module (bitmask.py) is imported on the first CUDA call.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch


@functools.cache
def _bitmask_kernel() -> ModuleType | None:
    """The triton kernel's module, or None where triton is not installed."""
    try:
        from infer_core.layers.sampling import bitmask
    except ImportError:
        return None
    return bitmask


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor,
                        use_kernel: bool | None = None) -> torch.Tensor:
    """``logits`` [R, V] with every token the rows' bitmasks do not allow at -inf.

    ``rows`` [M] int64 names the masked rows, ``bitmask`` [M, W] int32 their allowed tokens
    (interfaces/constraints.py has the layout); tokens past ``32 * W`` are not allowed. On CUDA
    (with triton), or with ``use_kernel=True`` (CPU tensors under ``TRITON_INTERPRET=1``), one kernel
    masks in place and returns the logits; otherwise torch unpacks the masked rows' bits and returns
    a new tensor.
    """
    kernel = _bitmask_kernel() if (use_kernel or (use_kernel is None and logits.is_cuda)) else None
    if use_kernel and kernel is None:
        raise RuntimeError("apply_token_bitmask(use_kernel=True) needs triton: pip install triton")
    if kernel is not None:
        target = logits if logits.stride(1) == 1 else logits.contiguous()
        kernel.apply_token_bitmask_(target, rows, bitmask)
        return target
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1).bool()[:, :vocab]  # [M, <= V], token order
    if allowed.shape[1] < vocab:
        allowed = torch.cat([allowed, allowed.new_zeros(allowed.shape[0], vocab - allowed.shape[1])], dim=1)
    masked = logits.index_select(0, rows).masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, rows, masked)
