"""Dynamic activation quantization in one launch: ``quantize.quantize_activations``'s numbers, bit for bit.

Before each W8A8 GEMM the activations are quantized per token (or per token and group of ``group_k`` columns):
``scale = max(max|x| * (1 / max_value), MIN_SCALE)``, ``q = x / scale`` rounded (half to even, int8 clamped to +-127)
or clamped to +-448 and rounded to e4m3. In torch ops that is about eight launches, each reading and writing the
rows in float32: at decode sizes, hundreds of tiny kernels a step (four projections a layer), which cost more
than reading half the weight bytes saves. Here one program per row and group reads its values twice (the
maximum, then the quantized values) and writes q and the scale. The division and the rounding are the exact
IEEE ones (``div_rn``; ties to even done with floors, e4m3's spacing from the exponent bits), so q and the scales
equal the reference's on either device.
Imports triton: imported only where a CUDA layer quantizes activations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_quant_w8a8.quantize import MIN_SCALE, RECIPROCAL_MAX, TORCH_DTYPES
from infer_quant_w8a8.schemes import ActivationFormat, QuantDtype

BLOCK_K = 1024  # columns a program holds at once (a row or group is walked in such tiles)


@triton.jit
def _round_half_even(v):
    """``v`` rounded to the nearest integer, ties to the even one (``torch.round``), for ``|v| < 2**22``."""
    f = tl.floor(v)
    d = v - f
    odd = f - 2.0 * tl.floor(f * 0.5)  # 1.0 where f is odd
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + odd))


@triton.jit
def _round_to_e4m3(v):
    """``v`` (``|v| <= 448``) rounded to the nearest float8 e4m3fn value, ties to even, as a float32: the
    conversion after it is then exact (the hardware's would round the same way; Triton's interpreter does not).
    A value's spacing is 2**(e - 3) for its exponent e, never below the subnormals' 2**-9."""
    e = tl.maximum(((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6) - 3
    step = ((e + 127) << 23).to(tl.float32, bitcast=True)  # 2**e and 2**-e: products by them are exact
    return _round_half_even(v * ((127 - e) << 23).to(tl.float32, bitcast=True)) * step


@triton.jit
def _quantize_rows(x_ptr, q_ptr, scale_ptr, k, group_len, num_groups, stride_x, stride_q,
                   QMAX: tl.constexpr, INV_QMAX: tl.constexpr, MIN_S: tl.constexpr, IS_INT8: tl.constexpr,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    group = tl.program_id(1)
    start = group * group_len
    offsets = tl.arange(0, BLOCK)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, group_len, BLOCK):
        cols = start + k0 + offsets
        mask = (k0 + offsets < group_len) & (cols < k)
        v = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(v))
    scale = tl.maximum(tl.max(amax, axis=0) * INV_QMAX, MIN_S)
    tl.store(scale_ptr + row * num_groups + group, scale)
    q_row = q_ptr + row.to(tl.int64) * stride_q
    for k0 in range(0, group_len, BLOCK):
        cols = start + k0 + offsets
        mask = (k0 + offsets < group_len) & (cols < k)
        v = tl.math.div_rn(tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32), scale)
        if IS_INT8:
            q = tl.minimum(tl.maximum(_round_half_even(v), -QMAX), QMAX).to(tl.int8)
        else:
            q = _round_to_e4m3(tl.minimum(tl.maximum(v, -QMAX), QMAX)).to(tl.float8e4nv)
        tl.store(q_row + cols, q, mask=mask)


def quantize_activations_fused(x: torch.Tensor, fmt: ActivationFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] -> (q [M, K], float32 scales [M, groups]) of a dynamic format, as ``quantize_activations``."""
    if fmt.static:
        raise ValueError("quantize_activations_fused quantizes dynamically; a static format has the checkpoint's scale")
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    group_len = k if fmt.group_k is None else fmt.group_k
    num_groups = -(-k // group_len)
    q = torch.empty((m, k), dtype=TORCH_DTYPES[fmt.dtype], device=x.device)
    scale = torch.empty((m, num_groups), dtype=torch.float32, device=x.device)
    if m:
        block = min(BLOCK_K, triton.next_power_of_2(group_len))
        _quantize_rows[(m, num_groups)](x, q, scale, k, group_len, num_groups, x.stride(0), q.stride(0),
                                        QMAX=float(fmt.dtype.max_value), INV_QMAX=RECIPROCAL_MAX[fmt.dtype],
                                        MIN_S=MIN_SCALE,
                                        IS_INT8=fmt.dtype is QuantDtype.INT8, BLOCK=block)
    return q, scale
