"""The W8 GEMV's Triton kernel (``gemv.py`` launches it): ``y = x @ dequant(Wq)^T (+ bias)``, optionally after the
RMSNorm (+ residual add) of x and before SiLU-and-mul.

The sums are ``sum_k x[m, k] * q[n, k] * scale[n, k // group_k]`` in float32, the output rounded once to x's
dtype after the bias. Per-channel weights (one scale a row) multiply the column sums by the row's scale once at
the end; grouped weights multiply each K tile's sums by its group's scale, the tile never wider than a group.
int8 weights become float32 by integer ops (``_int8_to_float``), FP8 ones by the conversion.

Each program owns ``BLOCK_N`` rows of W and walks the whole of K (no split-K, no atomics: the same bits every
run and in CUDA-graph replay); rows of x past ``num_rows`` repeat the last row and are not stored. With
``SILU`` (gate_up's ``[gate; up]`` weights) a program owns ``BLOCK_N`` columns of the activation: it loads a
gate tile and the matching up tile each K step and stores ``silu(gate) * up`` with ``fused/silu_and_mul.py``'s
arithmetic on gate and up rounded as the plain GEMV stores them.

With ``HAS_NORM`` x is first normalised as the core's norm kernel does it (``infer_core.layers.fused.norm_rows``):
every program takes its rows' sums of squares before its K loop, and normalises each K chunk it multiplies;
program 0 stores the residual sum. The first K step's W is loaded before that prologue (and before the PDL
wait), so the norm's work runs while W arrives, as in the core's fused norm + dense GEMV. Imports triton.
"""

from __future__ import annotations

import triton
import triton.language as tl
from infer_core.layers.fused.norm_rows import normed_chunk, rows_rstd
from infer_core.layers.fused.pdl import pdl_enter


@triton.jit
def _int8_to_float(w):
    """int8 -> float32 exactly with integer ops and one subtraction, not the conversion instruction (a fraction of
    the FMA rate on NVIDIA GPUs, and a GEMV does one FMA a weight): ``v + 128`` in [0, 255] placed in the mantissa
    of 2**23 is the float ``2**23 + 128 + v``."""
    bits = w.to(tl.int32) + 0x4B000080
    return bits.to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _load_raw(w_ptrs, k, K, EVEN_K: tl.constexpr):
    """A ``[BLOCK_N, BLOCK_K]`` tile of the 8-bit weights as stored (the K tail's lanes undefined: ``_to_float``
    zeroes them)."""
    if EVEN_K:
        w = tl.load(w_ptrs)
    else:  # masked lanes zeroed after the conversion (an 8-bit float has no literal zero to load as ``other``)
        w = tl.load(w_ptrs, mask=(k < K)[None, :])
    return w


@triton.jit
def _to_float(w, k, K, EVEN_K: tl.constexpr, W_INT8: tl.constexpr):
    """A tile of ``_load_raw`` as float32, the K tail zero."""
    w = _int8_to_float(w) if W_INT8 else w.to(tl.float32)
    if not EVEN_K:
        w = tl.where((k < K)[None, :], w, 0.0)
    return w


@triton.jit
def _x_chunk(x_ptr, res_ptr, norm_w_ptr, row, k, K, stride_xm, stride_rm, rstd_rows, offs_m, EVEN_K: tl.constexpr,
             HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """One K chunk of row ``row`` of the GEMV's input in float32: x's, or with ``HAS_NORM`` the norm's output."""
    if HAS_NORM:
        rstd = tl.sum(tl.where(offs_m == row, rstd_rows, 0.0), axis=0)  # the row's, exactly: a sum with zeros
        xm = normed_chunk(x_ptr, res_ptr, norm_w_ptr, row, k, K, stride_xm, stride_rm, rstd, HAS_RESIDUAL)
    elif EVEN_K:
        xm = tl.load(x_ptr + row * stride_xm + k).to(tl.float32)
    else:
        xm = tl.load(x_ptr + row * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
    return xm


@triton.jit
def _k_step(acc, acc_up, w, w_up, k0, block, x_ptr, res_ptr, norm_w_ptr, s_ptr, normed_ptr, rstd_rows, w_rows, up_rows,
            num_rows, K, stride_xm, stride_rm, stride_sn, GROUP_K: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_INT8: tl.constexpr, SILU: tl.constexpr,
            HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, STORE_NORMED: tl.constexpr):
    """``(acc, acc_up)`` with the K step at ``k0`` added: its raw weight tiles ``w`` (and ``w_up``) times each
    row's chunk, times the step's group scale where the scales are grouped."""
    k = k0 + tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    w = _to_float(w, k, K, EVEN_K, W_INT8)
    if SILU:
        w_up = _to_float(w_up, k, K, EVEN_K, W_INT8)
    tile = tl.zeros(acc.shape, dtype=tl.float32)
    tile_up = tl.zeros(acc.shape, dtype=tl.float32)
    for m in tl.static_range(BLOCK_M):
        row = tl.minimum(m, num_rows - 1)  # rows past num_rows: repeats, not stored
        xm = _x_chunk(x_ptr, res_ptr, norm_w_ptr, row, k, K, stride_xm, stride_rm, rstd_rows, offs_m, EVEN_K,
                      HAS_NORM, HAS_RESIDUAL)
        if STORE_NORMED:  # by block 0, its rows that are not repeats; float32 holding the dtype's values
            tl.store(normed_ptr + row * K + k, xm.to(normed_ptr.dtype.element_ty),
                     mask=k < tl.where((block == 0) & (row == m), K, 0))
        tile = tl.where(offs_m[:, None] == m, tile + tl.sum(w * xm[None, :], axis=1)[None, :], tile)
        if SILU:
            tile_up = tl.where(offs_m[:, None] == m, tile_up + tl.sum(w_up * xm[None, :], axis=1)[None, :], tile_up)
    if GROUP_K > 0:  # the tile lies in one group (BLOCK_K divides GROUP_K): one scale a row
        tile = tile * tl.load(s_ptr + w_rows * stride_sn + k0 // GROUP_K)[None, :]
        if SILU:
            tile_up = tile_up * tl.load(s_ptr + up_rows * stride_sn + k0 // GROUP_K)[None, :]
    return acc + tile, acc_up + tile_up


@triton.jit
def _column_block(block, w_first, w_first_up, x_ptr, res_ptr, norm_w_ptr, w_ptr, s_ptr, bias_ptr, y_ptr, normed_ptr,
                  rstd_rows, num_rows, N, K, stride_xm, stride_rm, stride_wn, stride_sn, stride_ym,
                  GROUP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, W_INT8: tl.constexpr, SILU: tl.constexpr,
                  HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, STORE_NORMED: tl.constexpr,
                  PRELOADED: tl.constexpr):
    """Columns ``block * BLOCK_N ...`` of y over the whole of K, stored; with ``PRELOADED`` the first K step's
    raw tiles are ``w_first`` (and ``w_first_up``), loaded by the caller. With ``STORE_NORMED`` block 0 also
    stores the normalised rows it multiplies."""
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = tl.minimum(cols, N - 1).to(tl.int64)  # past N: row N-1 again, never stored
    up_rows = w_rows + N  # SILU only
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    dtype = y_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # SILU only
    if PRELOADED:
        acc, acc_up = _k_step(acc, acc_up, w_first, w_first_up, 0, block, x_ptr, res_ptr, norm_w_ptr, s_ptr,
                              normed_ptr, rstd_rows, w_rows, up_rows, num_rows, K, stride_xm, stride_rm, stride_sn,
                              GROUP_K, BLOCK_M, BLOCK_K, EVEN_K, W_INT8, SILU, HAS_NORM, HAS_RESIDUAL, STORE_NORMED)
    for k0 in range(BLOCK_K if PRELOADED else 0, K, BLOCK_K):
        k = k0 + offs_k
        w = _load_raw(w_ptr + w_rows[:, None] * stride_wn + k[None, :], k, K, EVEN_K)
        w_up = w  # SILU only
        if SILU:
            w_up = _load_raw(w_ptr + up_rows[:, None] * stride_wn + k[None, :], k, K, EVEN_K)
        acc, acc_up = _k_step(acc, acc_up, w, w_up, k0, block, x_ptr, res_ptr, norm_w_ptr, s_ptr, normed_ptr,
                              rstd_rows, w_rows, up_rows, num_rows, K, stride_xm, stride_rm, stride_sn, GROUP_K,
                              BLOCK_M, BLOCK_K, EVEN_K, W_INT8, SILU, HAS_NORM, HAS_RESIDUAL, STORE_NORMED)
    if GROUP_K == 0:
        acc = acc * tl.load(s_ptr + w_rows * stride_sn)[None, :]
        if SILU:
            acc_up = acc_up * tl.load(s_ptr + up_rows * stride_sn)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if SILU:
            acc_up += tl.load(bias_ptr + N + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if SILU:  # silu_and_mul.py's arithmetic on gate and up as the plain GEMV stores them
        gate = acc.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = silu * acc_up.to(dtype).to(tl.float32)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, acc.to(dtype), mask=(offs_m[:, None] < num_rows) & (cols[None, :] < N))


@triton.jit(do_not_specialize=["num_rows"])
def w8_gemv_kernel(x_ptr, res_ptr, norm_w_ptr, w_ptr, s_ptr, bias_ptr, y_ptr, res_out_ptr, normed_ptr, num_rows, N,
                    K, stride_xm, stride_rm, stride_wn, stride_sn, stride_ym, eps, GROUP_K: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                    HAS_BIAS: tl.constexpr, W_INT8: tl.constexpr, SILU: tl.constexpr, HAS_NORM: tl.constexpr,
                    HAS_RESIDUAL: tl.constexpr, NORM_BLOCK_M: tl.constexpr, NORM_BLOCK_N: tl.constexpr,
                    STORE_NORMED: tl.constexpr, USE_PDL: tl.constexpr):
    """``y[M, N]``: ``x @ dequant(W)^T (+ bias)``, or with ``SILU`` ``silu(gate) * up`` of it (W has 2N rows: the
    gate rows, then the up rows); with ``HAS_NORM`` x is first ``rms_norm(x (+ residual))``
    (``infer_core.layers.fused.norm_rows``).
    A program computes column block ``program_id``. With ``HAS_NORM`` its first K step's W tiles are loaded
    before the PDL wait and the norm's prologue, which then run while they arrive (no kernel writes W)."""
    w_rows = tl.minimum(tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    w_first = 0
    w_first_up = 0
    if HAS_NORM:
        k = tl.arange(0, BLOCK_K)
        w_first = _load_raw(w_ptr + w_rows[:, None] * stride_wn + k[None, :], k, K, EVEN_K)
        w_first_up = w_first
        if SILU:
            w_first_up = _load_raw(w_ptr + (w_rows + N)[:, None] * stride_wn + k[None, :], k, K, EVEN_K)
    pdl_enter(USE_PDL)  # before any other load or store: launched early, waits for the kernel before
    offs_m = tl.arange(0, BLOCK_M)
    if HAS_NORM:
        rstd_rows = rows_rstd(x_ptr, res_ptr, res_out_ptr, num_rows, K, stride_xm, stride_rm, eps, offs_m, BLOCK_M,
                              NORM_BLOCK_M, NORM_BLOCK_N, HAS_RESIDUAL)
    else:
        rstd_rows = tl.zeros([BLOCK_M], dtype=tl.float32)
    _column_block(tl.program_id(0), w_first, w_first_up, x_ptr, res_ptr, norm_w_ptr, w_ptr, s_ptr, bias_ptr, y_ptr,
                  normed_ptr, rstd_rows, num_rows, N, K, stride_xm, stride_rm, stride_wn, stride_sn, stride_ym,
                  GROUP_K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HAS_BIAS, W_INT8, SILU, HAS_NORM, HAS_RESIDUAL,
                  STORE_NORMED, HAS_NORM)
