"""The RMSNorm (+ residual add) of ``rms_norm.py`` taken inside another kernel: a decode GEMV that computes its
input norm itself (``norm_gemv.py``, and quantized methods' GEMVs through ``LinearMethod.apply_with_norm``).

Every value is the one the norm kernel stores: ``x + residual`` rounded to the model dtype (program 0 alone stores
it, into a tensor of its own: the other programs still read the old residual); each row's sum of squares in
float32 by :func:`load_row_chunk` on the norm kernel's own tile (``rms_norm.single_pass_tile``), at its warp
count, since a sum's bits follow the thread layout; each chunk normalised and rounded, times the norm weight,
rounded again. Imports triton.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_row_chunk(x_ptr, res_ptr, x_offs, r_offs, mask, HAS_RESIDUAL: tl.constexpr):
    """The float32 values of ``x`` (+ ``residual``, rounded to x's dtype like a torch add)."""
    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + r_offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return x.to(tl.float32)


@triton.jit
def rows_rstd(x_ptr, res_ptr, res_out_ptr, num_rows, K, stride_xm, stride_rm, eps, offs_m,
              BLOCK_M: tl.constexpr, NORM_BLOCK_M: tl.constexpr, NORM_BLOCK_N: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr):
    """``1 / rms`` of each row of ``x (+ residual)`` as ``[BLOCK_M]``; program 0 stores ``x + residual``.

    Rows go in blocks of the norm kernel's tile ``[NORM_BLOCK_M, NORM_BLOCK_N]`` through its own load and sum,
    so each sum of squares is that kernel's. A row's value is taken out of the block by a sum of it and zeros
    (exact), which leaves the block's layout alone.
    """
    cols = tl.arange(0, NORM_BLOCK_N)
    block_rows = tl.arange(0, NORM_BLOCK_M)
    stored_rows = tl.where(tl.program_id(0) == 0, num_rows, 0)  # program 0 writes x + residual
    rstd_rows = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start in tl.static_range(0, BLOCK_M, NORM_BLOCK_M):
        rows = start + block_rows
        mask = (rows < num_rows)[:, None] & (cols < K)[None, :]
        x = load_row_chunk(x_ptr, res_ptr, (rows * stride_xm)[:, None] + cols[None, :],
                           (rows * stride_rm)[:, None] + cols[None, :], mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(res_out_ptr + (rows * K)[:, None] + cols[None, :], x.to(res_out_ptr.dtype.element_ty),
                     mask=(rows < stored_rows)[:, None] & (cols < K)[None, :])
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / K + eps)
        for i in tl.static_range(NORM_BLOCK_M):
            if start + i < BLOCK_M:
                row_rstd = tl.sum(tl.where(block_rows == i, rstd, 0.0), axis=0)
                rstd_rows = tl.where(offs_m == start + i, row_rstd, rstd_rows)
    return rstd_rows


@triton.jit
def normed_chunk(x_ptr, res_ptr, norm_w_ptr, row, k, K, stride_xm, stride_rm, rstd, HAS_RESIDUAL: tl.constexpr):
    """One K chunk of the norm's output row, rounded as ``rms_norm.py`` stores it, in float32."""
    mask = k < K
    dtype = norm_w_ptr.dtype.element_ty
    x = load_row_chunk(x_ptr, res_ptr, row * stride_xm + k, row * stride_rm + k, mask, HAS_RESIDUAL)
    y = (x * rstd).to(dtype).to(tl.float32)
    w = tl.load(norm_w_ptr + k, mask=mask, other=0.0).to(tl.float32)
    return (w * y).to(dtype).to(tl.float32)
