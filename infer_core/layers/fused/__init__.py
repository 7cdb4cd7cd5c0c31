"""Triton kernels for the per-layer elementwise ops (RMSNorm, rotary, SiLU-and-mul, Qwen3's q/k norm + rotary).

This package's ``__init__`` never imports triton: the layers ask :func:`use_triton` per call and
import the kernel module only on a CUDA tensor, so the core runs where triton is not installed.
Which implementation a layer uses on CUDA is one constant per op below; the CPU always runs the
torch reference code of the layer.
"""

from __future__ import annotations

import enum
import functools
import os

import torch


class FusedImpl(enum.Enum):
    TORCH = "torch"  # the layer's own torch code (eager), as on the CPU
    TRITON = "triton"  # our kernels in this package, on CUDA tensors only


# What each layer runs on CUDA; read when the layer is built (``layer.impl`` overrides one instance).
RMS_NORM = FusedImpl.TRITON
ROTARY = FusedImpl.TRITON
SILU_AND_MUL = FusedImpl.TRITON
# Qwen3's q-norm, k-norm and rotary as one launch (TORCH: the three layers, each by its own constant);
# read by the attention layer when built, and used only where the three layers would each run Triton.
QK_NORM_ROPE = FusedImpl.TRITON
# The dense linear layers' and the LM head's matmul at decode sizes (builtin/quant_none.py's GEMV_MAX_ROWS):
# TORCH is F.linear (cuBLAS); TRITON is fused/gemv.py, 1.11-1.16x cuBLAS at 1-2 rows on an H100 (benchmarks/gemv.py).
GEMV = FusedImpl.TRITON

# Programmatic dependent launch (Hopper and newer): our decode-path kernels let the next kernel's programs
# start while they drain, and wait (griddepcontrol.wait) before touching memory. The runner sets it from the
# ``pdl`` setting (INFER_PDL=false turns it off).
PDL = True

OPS = ("rms_norm", "rotary", "silu_and_mul", "qk_norm_rope", "gemv")


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def available() -> dict[str, bool]:
    """Which Triton kernels can run in this process (all need triton; they run on CUDA tensors)."""
    ok = triton_available() and torch.cuda.is_available()
    return {op: ok for op in OPS}


def use_triton(impl: FusedImpl, x: torch.Tensor) -> bool:
    return impl is FusedImpl.TRITON and x.is_cuda and triton_available()


@functools.cache
def _capability_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def use_pdl(x: torch.Tensor) -> bool:
    """Whether a kernel on ``x``'s device is launched with programmatic dependent launch (see ``fused/pdl.py``)."""
    if not (PDL and x.is_cuda) or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _capability_major(index) >= 9
