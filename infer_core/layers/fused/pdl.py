"""Programmatic dependent launch (PDL): the next kernel in the stream starts before this one ends.

Inside a CUDA graph a decode step is some 300 small kernels, and each one otherwise starts only
after the one before it has fully drained: a gap of a microsecond or more per kernel, at batch 1
a tenth of the step. A kernel launched with ``launch_pdl=True`` may be scheduled as soon as every
program of the kernel before it has called ``gdc_launch_dependents``; it then blocks in
``gdc_wait`` until that kernel has finished and its writes are visible. So every PDL kernel calls
:func:`pdl_enter` first, in every program, before any load or store: the wait is what keeps the
order of the stream (and, since each kernel waits for its predecessor's completion, the order of
all kernels before it). Kernels not launched with PDL (torch's, cuBLAS, flash-attn) keep the
normal stream order. ``use_pdl`` in ``fused/__init__.py`` decides per launch (CUDA, sm90+, not in
Triton's interpreter, ``INFER_PDL`` not 0).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pdl_enter(USE_PDL: tl.constexpr):
    """Wait for the kernel before this one, then let the kernel after this one be scheduled."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
