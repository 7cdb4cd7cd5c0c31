"""RMSNorm, optionally fused with the residual add before it, in one pass over each row.

Numerics are those of ``infer_core.layers.norm.RMSNorm`` (and HF): the sum ``x + residual`` is
rounded to the input dtype, the mean of squares is taken in float32, the normalised row is
rounded to the input dtype and only then multiplied by the weight. Rows may be the rows of a
2-D ``[T, N]`` tensor or the heads of a 3-D ``[T, H, N]`` view (Qwen3's per-head q/k norm, where
q and k are strided views into the fused qkv output); the outputs are new contiguous tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.norm_rows import load_row_chunk
from infer_core.layers.fused.pdl import pdl_enter

MAX_SINGLE_PASS = 16384  # rows longer than this are normalised in two passes over column chunks
ROW_ELEMENTS = 2048  # rows of a short N are packed into one program up to about this many elements
# Rows from this width run at LARGE_ROW_WARPS, and so does the GEMV after the norm (qkv, gate_up): at 2048 wide
# (Qwen3-30B-A3B, 1.7B-class models) the 2 warps ~32 elements a thread give left that GEMV at 0.4-0.5 of its
# bytes floor (benchmarks.gemv --fused --sweep; decode-graph-kernels-h100-* logs)
LARGE_ROW = 2048
LARGE_ROW_WARPS = 8


@triton.jit(do_not_specialize=["num_rows"])
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    num_rows,
    inner_rows,
    n_cols,
    stride_x_outer,
    stride_x_inner,
    stride_x_col,
    stride_r_outer,
    stride_r_inner,
    stride_r_col,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    outer, inner = rows // inner_rows, rows % inner_rows
    x_row = (outer * stride_x_outer + inner * stride_x_inner)[:, None]
    r_row = (outer * stride_r_outer + inner * stride_r_inner)[:, None]
    out_row = (rows * n_cols)[:, None]  # outputs are contiguous [num_rows, n_cols]
    cols = tl.arange(0, BLOCK_N)
    out_dtype = out_ptr.dtype.element_ty
    x_dtype = x_ptr.dtype.element_ty

    if SINGLE_PASS:
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = load_row_chunk(x_ptr, res_ptr, x_row + cols[None, :] * stride_x_col,
                            r_row + cols[None, :] * stride_r_col, mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(res_out_ptr + out_row + cols[None, :], x.to(x_dtype), mask=mask)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = (x * rstd[:, None]).to(x_dtype).to(tl.float32)
        tl.store(out_ptr + out_row + cols[None, :], (w[None, :] * y).to(out_dtype), mask=mask)
    else:
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c < n_cols)[None, :]
            x = load_row_chunk(x_ptr, res_ptr, x_row + c[None, :] * stride_x_col,
                                r_row + c[None, :] * stride_r_col, mask, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                tl.store(res_out_ptr + out_row + c[None, :], x.to(x_dtype), mask=mask)
            sum_sq += tl.sum(x * x, axis=1)
        rstd = tl.math.rsqrt(sum_sq / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c < n_cols)[None, :]
            # the sum is recomputed from the inputs rather than read back from res_out
            x = load_row_chunk(x_ptr, res_ptr, x_row + c[None, :] * stride_x_col,
                                r_row + c[None, :] * stride_r_col, mask, HAS_RESIDUAL)
            w = tl.load(w_ptr + c, mask=c < n_cols, other=0.0).to(tl.float32)
            y = (x * rstd[:, None]).to(x_dtype).to(tl.float32)
            tl.store(out_ptr + out_row + c[None, :], (w[None, :] * y).to(out_dtype), mask=mask)


def _row_view(t: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(num_rows, inner_rows, outer stride, inner stride, column stride) of a 1-, 2- or 3-D tensor."""
    if t.dim() == 3:
        return t.shape[0] * t.shape[1], t.shape[1], t.stride(0), t.stride(1), t.stride(2)
    if t.dim() == 2:
        return t.shape[0], 1, t.stride(0), 0, t.stride(1)
    if t.dim() == 1:
        return 1, 1, 0, 0, t.stride(0)
    raise ValueError(f"rms_norm takes a 1-, 2- or 3-D tensor, got shape {tuple(t.shape)}; reshape it first")


def checked_residual_out(out: torch.Tensor, x) -> torch.Tensor:
    """``out`` where it can take the sum ``x + residual`` (x: a tensor, or anything of its shape and dtype)."""
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"residual_out {tuple(out.shape)} {out.dtype} must be a contiguous tensor of x's shape "
                         f"and dtype, {tuple(x.shape)} {x.dtype}: the kernel writes it row after row")
    return out


def _tiles(n_cols: int, max_single_pass: int) -> tuple[int, int, bool, int]:
    """(BLOCK_M, BLOCK_N, single pass, num_warps) for rows of ``n_cols`` elements."""
    single = n_cols <= max_single_pass
    block_n = triton.next_power_of_2(n_cols) if single else min(4096, triton.next_power_of_2(max_single_pass))
    block_m = max(1, ROW_ELEMENTS // block_n) if single else 1
    num_warps = max(1, min(16, block_m * block_n // 1024))  # ~32 elements a thread: the best of a sweep
    if block_n >= LARGE_ROW:
        # the norm + GEMV after it (qkv, gate_up of 2B- to 8B-class models) runs at the norm's warp count
        # (gemv.config_after_rms_norm). At 8, two of its programs fit an SM (about 128 registers a thread);
        # at 16 one did, and each waited alone on its W loads (a Qwen3-8B decode step measured slower).
        num_warps = LARGE_ROW_WARPS
    return block_m, block_n, single, num_warps


def single_pass_tile(k: int) -> tuple[int, int, int]:
    """(rows, columns, warps) of this kernel's one-pass tile on rows of ``k`` elements: what a kernel that computes
    the norm itself (``norm_rows.rows_rstd``) must sum on, and at, to get this kernel's bits."""
    if not 0 < k <= MAX_SINGLE_PASS:
        raise ValueError(f"a norm inside another kernel takes rows of 1 to {MAX_SINGLE_PASS} elements, got {k}: run "
                         "rms_norm, then the kernel")
    block_m, block_n, _, warps = _tiles(k, MAX_SINGLE_PASS)
    return block_m, block_n, warps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *,
             max_single_pass: int = MAX_SINGLE_PASS, residual_out: torch.Tensor | None = None):
    """``norm(x)``, or ``(norm(x + residual), x + residual)`` with ``residual``; the last dim is normalised.

    The sum goes to a new tensor, or to ``residual_out`` (contiguous, x's shape and dtype) where given.
    """
    n_cols = x.shape[-1]
    if weight.shape != (n_cols,):
        raise ValueError(f"weight of shape {tuple(weight.shape)} does not match the last dim {n_cols} of x")
    num_rows, inner_rows, sxo, sxi, sxc = _row_view(x)
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    has_residual = residual is not None
    if has_residual:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x "
                             f"{tuple(x.shape)} {x.dtype}")
        _, _, sro, sri, src = _row_view(residual)
        res_out = checked_residual_out(residual_out, x) if residual_out is not None else torch.empty(
            x.shape, dtype=x.dtype, device=x.device)
    else:
        sro, sri, src, residual, res_out = sxo, sxi, sxc, x, out  # unused by the kernel
    if num_rows > 0 and n_cols > 0:
        block_m, block_n, single, num_warps = _tiles(n_cols, max_single_pass)
        pdl = use_pdl(x)
        _rms_norm_kernel[(triton.cdiv(num_rows, block_m),)](
            x, residual, weight.contiguous(), out, res_out, num_rows, inner_rows, n_cols, sxo, sxi, sxc, sro, sri,
            src, eps, HAS_RESIDUAL=has_residual, SINGLE_PASS=single, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps,
            USE_PDL=pdl, launch_pdl=pdl,
        )
    return (out, res_out) if has_residual else out
