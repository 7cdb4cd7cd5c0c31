"""Triton kernels for the per-layer ops (RMSNorm, rotary, SiLU-and-mul, Qwen3's q/k norm + rotary, the decode
GEMV and its fusions, the experts' grouped GEMMs), and the one rule by which a layer chooses them: :func:`runs_triton`.

A layer decides once, when it is built, whether it runs our Triton kernels or its own torch code (as vLLM's
``CustomOp`` picks its forward in ``__init__``); per call it checks only shapes (e.g. the GEMV's decode-sized
row counts). The decision follows the device the layer is built on (the runner builds the model under
``torch.device``): build a layer where it will run. This package's ``__init__`` never imports triton, and a
layer imports a kernel module only on its Triton path, so the core runs where triton is not installed.
"""

from __future__ import annotations

import enum
import functools
import os

import torch


class FusedImpl(enum.Enum):
    TORCH = "torch"  # the layer's own torch code (eager), as on the CPU
    TRITON = "triton"  # our kernels in this package, where runs_triton allows them


# What each op runs where Triton runs (see runs_triton); read when a layer is built.
RMS_NORM = FusedImpl.TRITON
ROTARY = FusedImpl.TRITON
SILU_AND_MUL = FusedImpl.TRITON
# Qwen3's q-norm, k-norm and rotary as one launch (TORCH: the three layers, each by its own constant); used
# only where the three layers would each run Triton.
QK_NORM_ROPE = FusedImpl.TRITON
# The dense linear layers' and the LM head's matmul at decode sizes (fused/dense.py's GEMV_MAX_ROWS): TORCH is
# F.linear (cuBLAS); TRITON is fused/gemv.py, faster there at 1-2 rows (benchmarks/gemv.py).
GEMV = FusedImpl.TRITON
# An RMSNorm and the dense GEMV it feeds (and gate_up's SiLU-and-mul) as one launch at decode sizes
# (fused/gemv_fusion.py); TORCH keeps the layers separate. Used only where each would run Triton.
NORM_GEMV = FusedImpl.TRITON
# A mixture-of-experts layer (layers/moe): the router's top-k in one launch (fused/moe_route.py), the entries
# grouped by expert in one launch at decode sizes (fused/moe_align.py), one grouped-GEMM launch for every
# expert's gate_up with SiLU-and-mul and one for down (fused/moe_gemm.py); TORCH routes with torch ops and loops
# over the experts that got tokens (host syncs: no CUDA graphs then).
MOE = FusedImpl.TRITON

# The device types on whose tensors layers run our Triton kernels. CUDA; and the CPU only where Triton's
# interpreter runs (TRITON_INTERPRET=1, set before any kernel module is imported) and "cpu" is added here:
# that is how the tests run the kernels through the layers and the model on a machine without a GPU
# (tests/fused/conftest.py). The interpreter alone does not take the CPU: a test process sets it for the
# whole run, and the CPU engines of every other test in that process must keep running the torch code.
TRITON_DEVICES: tuple[str, ...] = ("cuda",)

# Programmatic dependent launch (Hopper and newer): our decode-path kernels let the next kernel's programs
# start while they drain, and wait (griddepcontrol.wait) before touching memory. The runner sets it from the
# ``pdl`` setting (INFER_PDL=false turns it off).
PDL = True

OPS = ("rms_norm", "rotary", "silu_and_mul", "qk_norm_rope", "gemv", "norm_gemv", "moe")


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether this process runs Triton kernels in Triton's interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def available() -> dict[str, bool]:
    """Which Triton kernels can run in this process (all need triton; they run on CUDA tensors)."""
    ok = triton_available() and torch.cuda.is_available()
    return {op: ok for op in OPS}


def runs_triton(impl: FusedImpl, device: torch.device | str) -> bool:
    """Whether a layer built on ``device`` runs our Triton kernel for an op set to ``impl`` (else its torch code).

    Called once, when the layer is built: CUDA devices take the kernels; the CPU only where it is listed in
    ``TRITON_DEVICES`` and the process runs Triton's interpreter.
    """
    device_type = torch.device(device).type
    if impl is not FusedImpl.TRITON or device_type not in TRITON_DEVICES or not triton_available():
        return False
    return device_type == "cuda" or (device_type == "cpu" and interpreting())


@functools.cache
def _capability_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def use_pdl(x: torch.Tensor) -> bool:
    """Whether a kernel on ``x``'s device is launched with programmatic dependent launch (see ``fused/pdl.py``)."""
    if not (PDL and x.is_cuda) or interpreting():
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _capability_major(index) >= 9
