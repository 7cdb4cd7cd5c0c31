"""The W8A8 products of more rows than the GEMV takes, one function per kernel, chosen when a layer is built.

Each takes the flat rows ``x`` [M, K], the quantized weight [N, K] and its float32 scales [N, groups], the
layer's scheme, the bias and the static input scale, and returns ``x @ W^T + bias`` in x's dtype:

- ``reference``: :func:`infer_quant_w8a8.quantize.reference_linear` (int8 summed exactly by ``torch._int_mm``,
  e4m3 in float32). The CPU's path, and where no GPU kernel below applies (groups of K columns).
- ``fp8_scaled_mm``: ``torch._scaled_mm`` with row-wise scales (a scale per token, a scale per weight row)
  and a bfloat16 bias in its float32 epilogue, Hopper's FP8 tensor cores; K and N multiples of 16. The
  tensor cores sum each MMA's 32 products aligned to the largest of them and the partial sum, keeping about
  14 bits (cuBLAS / CUTLASS move the partial sums to float32 every 4 MMAs): not the reference's float32 sums
  bit for bit (``tests/test_gemm.py`` bounds the difference).
- ``int8_int_mm``: ``torch._int_mm`` (int32 sums) and the scales applied after; K and N multiples of 8, and
  more than 16 rows (fewer are padded to 17: only 9-16-row batches, the GEMV takes up to 8).

The GPU paths quantize dynamic activations in one launch (``act_quant.py``, the reference's numbers); a static
input scale (the checkpoint's) keeps the torch ops. Everything runs under CUDA graphs. ``PRODUCTS`` holds each
GEMM's part after the quantization, for activations quantized elsewhere (with their norm: ``norm_quant.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infer_quant_w8a8.quantize import quantize_activations, reference_linear, scaled_product
from infer_quant_w8a8.schemes import LinearScheme, QuantDtype

GemmFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, LinearScheme, "torch.Tensor | None",
                   "torch.Tensor | None"], torch.Tensor]
ProductFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LinearScheme, "torch.Tensor | None",
                      torch.dtype], torch.Tensor]

INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA takes more than 16 rows


def _rowwise(x_scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A [rows, 1] float32 scale per row (a static per-tensor scale repeated)."""
    return x_scale if x_scale.shape[0] == rows else x_scale.expand(rows, 1).contiguous()


def _quantize_on_gpu(x: torch.Tensor, scheme: LinearScheme, input_scale: torch.Tensor | None):
    """``x`` quantized as the scheme's activations: one launch when they are dynamic and on the GPU."""
    if scheme.activation.static or not x.is_cuda:
        return quantize_activations(x, scheme.activation, input_scale)
    from infer_quant_w8a8.act_quant import quantize_activations_fused

    return quantize_activations_fused(x, scheme.activation)


def fp8_scaled_mm(x, weight, scale, scheme, bias, input_scale):
    xq, x_scale = _quantize_on_gpu(x, scheme, input_scale)
    return fp8_product(xq, x_scale, weight, scale, scheme, bias, x.dtype)


def fp8_product(xq, x_scale, weight, scale, scheme, bias, out_dtype):
    # Row-wise scaling writes bfloat16. A bfloat16 bias goes into the GEMM's float32 epilogue
    # (``sums * x_scale * w_scale + bias``, rounded once, as the reference); any other is added after the
    # rounding of the product (two roundings: an error of half a bfloat16 ulp of the product, not of the sum).
    fused_bias = bias is not None and bias.dtype == torch.bfloat16
    out = torch._scaled_mm(xq, weight.t(), scale_a=_rowwise(x_scale, xq.shape[0]), scale_b=scale.view(1, -1),
                           bias=bias if fused_bias else None, out_dtype=torch.bfloat16)
    if bias is not None and not fused_bias:
        out = out.float() + bias.float()
    return out if out.dtype == out_dtype else out.to(out_dtype)


def int8_int_mm(x, weight, scale, scheme, bias, input_scale):
    xq, x_scale = _quantize_on_gpu(x, scheme, input_scale)
    return int8_product(xq, x_scale, weight, scale, scheme, bias, x.dtype)


def int8_product(xq, x_scale, weight, scale, scheme, bias, out_dtype):
    rows = xq.shape[0]
    if rows < INT_MM_MIN_ROWS:
        xq = F.pad(xq, (0, 0, 0, INT_MM_MIN_ROWS - rows))
    sums = torch._int_mm(xq, weight.t())[:rows]
    out = sums.float() * x_scale * scale.view(1, -1)
    if bias is not None:
        out += bias.float()
    return out.to(out_dtype)


def reference(x, weight, scale, scheme, bias, input_scale):
    return reference_linear(x, weight, scale, scheme, bias, input_scale)


def reference_product(xq, x_scale, weight, scale, scheme, bias, out_dtype):
    out = scaled_product(xq, x_scale, weight, scale, scheme.weight.group_k)
    if bias is not None:
        out += bias.float()
    return out.to(out_dtype)


# Each GEMM's product of activations already quantized (by the scheme's dynamic format), the rest of its work:
# ``(xq, x_scale, weight, scale, scheme, bias, out_dtype)`` -> the GEMM's output on the same q and scales.
PRODUCTS: dict[GemmFn, ProductFn] = {fp8_scaled_mm: fp8_product, int8_int_mm: int8_product,
                                     reference: reference_product}


def choose_gemm(scheme: LinearScheme, n: int, k: int, device: torch.device) -> GemmFn:
    """The kernel of a layer of ``n`` x ``k`` weights on ``device``, chosen once when it is built."""
    if device.type != "cuda" or scheme.weight.group_k is not None:
        return reference
    if scheme.weight.dtype is QuantDtype.FP8 and n % 16 == 0 and k % 16 == 0:
        return fp8_scaled_mm
    if scheme.weight.dtype is QuantDtype.INT8 and n % 8 == 0 and k % 8 == 0:
        return int8_int_mm
    return reference
