"""The one matrix product the kernels use, with a path around an interpreter limitation."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in float32.

    ``UPCAST`` (set under TRITON_INTERPRET=1) multiplies in float32: the interpreter's dot reads
    bfloat16 operands as raw bits. The operands were already rounded to their storage type, so
    the result is what the GPU's bfloat16 tensor cores compute.
    """
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)
