"""A layer's input RMSNorm (+ residual add) and the dynamic per-token quantization of its output in one launch: the
W8A8 GEMM's activations straight from the norm (``LinearMethod.apply_with_norm`` at GEMM sizes).

Unfused, a prefill or large decode step runs the core's norm kernel (writing the normalised rows in the model
dtype) and then ``act_quant``'s launch (reading them back, writing q and the scales) before each qkv and gate_up
GEMM. Here one program normalises its rows on the norm kernel's own tile and warp count
(``rms_norm.single_pass_tile``, the sums' bits follow the thread layout), rounds them as that kernel stores them,
and quantizes the rounded values as ``act_quant`` does: the residual sum, the normalised rows (where kept) and
q and the scales are the two launches' values bit for bit. Imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.norm_rows import load_row_chunk
from infer_core.layers.fused.pdl import pdl_enter
from infer_core.layers.fused.rms_norm import single_pass_tile

from infer_quant_w8a8.act_quant import _round_half_even, _round_to_e4m3
from infer_quant_w8a8.quantize import MIN_SCALE, RECIPROCAL_MAX, TORCH_DTYPES
from infer_quant_w8a8.schemes import ActivationFormat, QuantDtype


@triton.jit(do_not_specialize=["num_rows"])
def _rms_norm_quant_kernel(x_ptr, res_ptr, w_ptr, q_ptr, scale_ptr, res_out_ptr, normed_ptr, num_rows, K, stride_xm,
                           stride_rm, eps, QMAX: tl.constexpr, INV_QMAX: tl.constexpr, MIN_S: tl.constexpr,
                           IS_INT8: tl.constexpr, HAS_RESIDUAL: tl.constexpr, STORE_NORMED: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < num_rows)[:, None] & (cols < K)[None, :]
    out_offs = (rows * K)[:, None] + cols[None, :]
    dtype = x_ptr.dtype.element_ty
    x = load_row_chunk(x_ptr, res_ptr, (rows * stride_xm)[:, None] + cols[None, :],
                       (rows * stride_rm)[:, None] + cols[None, :], mask, HAS_RESIDUAL)
    if HAS_RESIDUAL:
        tl.store(res_out_ptr + out_offs, x.to(dtype), mask=mask)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / K + eps)
    w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    y = (x * rstd[:, None]).to(dtype).to(tl.float32)
    normed = (w[None, :] * y).to(dtype)
    if STORE_NORMED:
        tl.store(normed_ptr + out_offs, normed, mask=mask)
    v = normed.to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(v), axis=1) * INV_QMAX, MIN_S)
    tl.store(scale_ptr + rows, scale, mask=rows < num_rows)
    v = tl.math.div_rn(v, scale[:, None])
    if IS_INT8:
        q = tl.minimum(tl.maximum(_round_half_even(v), -QMAX), QMAX).to(tl.int8)
    else:
        q = _round_to_e4m3(tl.minimum(tl.maximum(v, -QMAX), QMAX)).to(tl.float8e4nv)
    tl.store(q_ptr + out_offs, q, mask=mask)


def rms_norm_quantize(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, fmt: ActivationFormat,
                      residual: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
                      normed_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_activations_fused(rms_norm(x (+ residual), norm_weight, eps), fmt)`` in one launch: (q [M, K],
    float32 scales [M, 1]) of a dynamic per-token format. With ``residual`` the sum ``x + residual`` is written
    into ``residual_out``; ``normed_out`` (where given) gets the norm's output. x [M, K] in the norm weight's dtype.
    """
    if fmt.static or fmt.group_k is not None:
        raise ValueError(f"rms_norm_quantize quantizes per token and dynamically, got {fmt}: run the norm, then "
                         "quantize_activations")
    if x.dim() != 2 or norm_weight.shape != (x.shape[1],) or norm_weight.dtype != x.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} must be [M, K] with a norm weight [K] of its dtype, got "
                         f"{tuple(norm_weight.shape)} {norm_weight.dtype}")
    m, k = x.shape
    block_m, block_n, warps = single_pass_tile(k)
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or residual_out is None):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype} "
                         "and come with a residual_out")
    for name, t in (("residual_out", residual_out), ("normed_out", normed_out)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or not t.is_contiguous()):
            raise ValueError(f"{name} {tuple(t.shape)} {t.dtype} must be contiguous, of x's shape and dtype")
    if x.stride(1) != 1:
        x = x.contiguous()
    res = x if residual is None else residual
    if res.stride(1) != 1:
        res = res.contiguous()
    q = torch.empty((m, k), dtype=TORCH_DTYPES[fmt.dtype], device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        pdl = use_pdl(x)
        _rms_norm_quant_kernel[(triton.cdiv(m, block_m),)](
            x, res, norm_weight, q, scale, residual_out if residual_out is not None else x,
            normed_out if normed_out is not None else x, m, k, x.stride(0), res.stride(0), eps,
            QMAX=float(fmt.dtype.max_value), INV_QMAX=RECIPROCAL_MAX[fmt.dtype], MIN_S=MIN_SCALE,
            IS_INT8=fmt.dtype is QuantDtype.INT8, HAS_RESIDUAL=residual is not None,
            STORE_NORMED=normed_out is not None, BLOCK_M=block_m, BLOCK_N=block_n, USE_PDL=pdl,
            num_warps=warps, launch_pdl=pdl,
        )
    return q, scale
