"""Quantizing weights and activations, and the reference W8A8 product every kernel is checked against.

Symmetric throughout: ``scale = max|v| / max_value`` over the values that share it, ``q = v / scale`` rounded
to the nearest integer (int8, clamped to [-127, 127]) or to the nearest float8 e4m3fn (clamped to +-448), and
``v ~= q * scale``. Scales are float32. Torch ops only, so they run on any device and under CUDA graphs.
A dynamic activation scale is ``max|x|`` times the float32 reciprocal of ``max_value``, not a division: torch on
CUDA divides by a Python number that way and the CPU does not, so a division would give scales one ulp apart
on half the rows of the two devices, and the one-launch kernel (``act_quant.py``) could not equal both.
"""

from __future__ import annotations

import torch

from infer_quant_w8a8.schemes import ActivationFormat, LinearScheme, QuantDtype, WeightFormat

# The smallest scale: a row (or group) of zeros quantizes to zeros, with no division by zero.
MIN_SCALE = 1e-12

# ``1 / max_value`` rounded to float32, per type (a Python float holding exactly that value)
RECIPROCAL_MAX = {dtype: torch.tensor(1.0 / dtype.max_value, dtype=torch.float32).item() for dtype in QuantDtype}

TORCH_DTYPES = {QuantDtype.INT8: torch.int8, QuantDtype.FP8: torch.float8_e4m3fn}


def to_quantized(scaled: torch.Tensor, dtype: QuantDtype) -> torch.Tensor:
    """``scaled`` (values already divided by their scale) as int8 or float8 e4m3fn."""
    limit = dtype.max_value
    if dtype is QuantDtype.INT8:
        return scaled.round().clamp_(-limit, limit).to(torch.int8)
    return scaled.clamp(-limit, limit).to(torch.float8_e4m3fn)


def _grouped(v: torch.Tensor, group_k: int | None) -> torch.Tensor:
    """``v`` [rows, K] as [rows, groups, group_k] (the last group zero-padded), or [rows, 1, K]."""
    rows, k = v.shape
    if group_k is None:
        return v.view(rows, 1, k)
    groups = -(-k // group_k)
    if groups * group_k != k:
        v = torch.nn.functional.pad(v, (0, groups * group_k - k))
    return v.view(rows, groups, group_k)


def quantize_weight(weight: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] (any float dtype) -> (q [N, K], scale float32 [N, groups])."""
    w = weight.float()
    grouped = _grouped(w, fmt.group_k)
    scale = (grouped.abs().amax(dim=-1) / fmt.dtype.max_value).clamp_(min=MIN_SCALE)
    q = to_quantized(grouped / scale[..., None], fmt.dtype).flatten(1)[:, : w.shape[1]]
    return q.contiguous(), scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, group_k: int | None = None) -> torch.Tensor:
    """float32 ``q * scale`` for weights of one scale per row (``scale`` [N, 1]) or per row and group of
    ``group_k`` columns."""
    k = q.shape[1]
    return (_grouped(q.float(), group_k) * scale[..., None]).flatten(1)[:, :k]


def expand_block_scales(block_scale: torch.Tensor, rows: int, block_n: int) -> torch.Tensor:
    """A checkpoint's ``[ceil(rows / block_n), groups]`` block scales as one scale per row and group."""
    return block_scale.float().repeat_interleave(block_n, dim=0)[:rows]


def quantize_activations(x: torch.Tensor, fmt: ActivationFormat,
                         static_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] -> (q [M, K], scale float32 [M, groups] or, static, the checkpoint's [1, 1])."""
    if fmt.static:
        if static_scale is None:
            raise ValueError("a static activation format needs the checkpoint's input_scale")
        scale = static_scale.float().reshape(1, 1)
        return to_quantized(x.float() / scale, fmt.dtype), scale
    grouped = _grouped(x.float(), fmt.group_k)
    scale = (grouped.abs().amax(dim=-1) * RECIPROCAL_MAX[fmt.dtype]).clamp_(min=MIN_SCALE)
    q = to_quantized(grouped / scale[..., None], fmt.dtype).flatten(1)[:, : x.shape[1]]
    return q, scale


def group_sums(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """float32 ``xq @ wq^T`` of quantized values: int8 on the CPU summed exactly in int32 (``torch._int_mm``, as
    the GPU's int8 GEMMs; on the GPU that needs more than 16 rows, and float32 sums are exact to 2**24), e4m3
    values (exact in float32) summed in float32 (as the GPU's FP8 GEMMs)."""
    if xq.dtype == torch.int8 and not xq.is_cuda:
        return torch._int_mm(xq.contiguous(), wq.t()).float()
    return xq.float() @ wq.float().T


def scaled_product(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                   group_k: int | None = None) -> torch.Tensor:
    """float32 ``sum_g (xq_g @ wq_g^T) * x_scale[:, g] * w_scale[:, g]``: the W8A8 product over groups of
    ``group_k`` columns (None: one group, per-channel weights), each group's sum by :func:`group_sums`, the
    scales applied in float32. ``x_scale`` has one column per group, or one for all."""
    if group_k is None:
        return group_sums(xq, wq) * x_scale[:, :1] * w_scale[:, 0][None, :]
    m, k = xq.shape
    out = torch.zeros(m, wq.shape[0], dtype=torch.float32, device=xq.device)
    for g in range(w_scale.shape[1]):
        cols = slice(g * group_k, min(k, (g + 1) * group_k))
        xs = x_scale[:, g if x_scale.shape[1] > 1 else 0]
        out += group_sums(xq[:, cols], wq[:, cols]) * xs[:, None] * w_scale[None, :, g]
    return out


def reference_linear(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, scheme: LinearScheme,
                     bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` as W8A8 computes it: ``x`` quantized by the scheme's activation format, then
    :func:`scaled_product`, then the bias; rounded once to x's dtype. The CPU's path, and the reference of
    every kernel."""
    rows = x.reshape(-1, x.shape[-1])
    xq, x_scale = quantize_activations(rows, scheme.activation, input_scale)
    out = scaled_product(xq, x_scale, wq, w_scale, scheme.weight.group_k)
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], wq.shape[0])
