"""The decode GEMV with its neighbours in one launch: RMSNorm (+ residual add) before it, SiLU-and-mul after it.

At 1-2 rows a decoder layer runs norm -> qkv GEMV and norm -> gate_up GEMV -> SiLU-and-mul, each a
short launch that reads a few KiB. Here one GEMV launch does all of it:

- norm: x has K <= 16384 elements a row, so every program recomputes the row's sum of squares itself
  (x and the residual come from L2) before its K loop, and in the loop normalises the K chunk it
  multiplies. Program 0 alone writes ``x + residual`` (the next residual) into its own tensor: the
  other programs still read the old residual.
- SiLU-and-mul: ``[gate; up]`` weights of 2I rows give I outputs; a program owns columns j of gate
  and the same j of up (rows j and I + j of W: also a tensor-parallel shard of gate_up is
  ``[gate shard; up shard]``), so its outputs need nothing from other programs.

W is read before the PDL wait as in ``gemv.py``: a program whose tile holds all of K
(``config_after_rms_norm`` prefers those) loads it into registers; either way W streams in while the
kernel before drains and while the norm's prologue runs, and the K loop is the plain GEMV's.

Tiles of several K steps (gate_up from K=4096, qkv where no 4-column tile holds K) launch persistent
(``GemvConfig.programs_per_sm``): some two programs an SM, each walking column blocks, so the prologue
runs once a program instead of once a block; at a program a block it ran once a wave, each time before
the wave's first W load.

Bit for bit what ``fused/rms_norm.py``, ``fused/gemv.py`` and ``fused/silu_and_mul.py`` give one after
the other: each value is rounded to the dtype where those kernels store it (the sum x + residual,
the normalised row, the row times the norm weight, gate and up, silu(gate)), the sum of squares is
``rms_norm.py``'s own code on its own tile shape, and the column sums are ``gemv.py``'s
``add_row_products`` on the same tiles. A sum's bits also depend on the warp count (it sets how the
compiler spreads a tile over threads), so the launch runs at the norm kernel's warp count, and so
does the GEMV after a norm when unfused (``gemv.config_after_rms_norm``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv import (
    MAX_ROWS,
    GemvConfig,
    add_row_products,
    choose_config,
    config_after_rms_norm,
    load_w_tile,
    num_sms,
    prefetch_lines,
    prefetch_w_to_l2,
)
from infer_core.layers.fused.pdl import pdl_enter
from infer_core.layers.fused.norm_rows import normed_chunk, rows_rstd
from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS, checked_residual_out
from infer_core.layers.fused.rms_norm import _tiles as norm_tiles


@triton.jit(do_not_specialize=["num_rows"])
def _norm_gemv_kernel(
    x_ptr,
    res_ptr,
    norm_w_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    res_out_ptr,
    normed_ptr,
    num_rows,
    N,
    K,
    stride_xm,
    stride_rm,
    stride_wn,
    stride_ym,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SINGLE_STEP: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    NORM_BLOCK_M: tl.constexpr,
    NORM_BLOCK_N: tl.constexpr,
    SILU: tl.constexpr,
    STORE_NORMED: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """``y[M, N]``: (silu(gate) * up of) ``norm(x (+ residual)) @ W^T (+ bias)``; N is I with SILU (W has 2I rows).
    With ``STORE_NORMED`` the first column block also stores the normalised rows it multiplies, ``[M, K]``.

    Program p computes column blocks p, p + P, p + 2P, ... (P programs): one block each unless the
    launch is persistent (fewer programs than blocks), which pays the norm's prologue once per program.
    """
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    # the first block's W: columns past N re-read row N-1 and are not stored (as in gemv.py); up rows are N
    # below their gate rows
    first_rows = tl.minimum(tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    if SINGLE_STEP:  # no kernel writes weights: the whole tile may load while the kernel before drains
        gate_first = load_w_tile(w_ptr + (first_rows * stride_wn)[:, None] + offs_k[None, :], offs_k, K, EVEN_K)
        if SILU:
            up_first = load_w_tile(w_ptr + ((first_rows + N) * stride_wn)[:, None] + offs_k[None, :], offs_k, K,
                                   EVEN_K)
    if PREFETCH_LINES > 0:  # several steps: the first ones' W streams into L2 meanwhile
        prefetch_w_to_l2(w_ptr, first_rows * stride_wn, K, PREFETCH_LINES)
        if SILU:
            prefetch_w_to_l2(w_ptr, (first_rows + N) * stride_wn, K, PREFETCH_LINES)
    pdl_enter(USE_PDL)  # before any other load or store: see fused/pdl.py
    if HAS_NORM:
        rstd_rows = rows_rstd(x_ptr, res_ptr, res_out_ptr, num_rows, K, stride_xm, stride_rm, eps, offs_m,
                               BLOCK_M, NORM_BLOCK_M, NORM_BLOCK_N, HAS_RESIDUAL)
    dtype = y_ptr.dtype.element_ty
    num_blocks = tl.cdiv(N, BLOCK_N)
    for block in tl.range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
        col_rows = tl.minimum(cols, N - 1).to(tl.int64)
        gate_ptrs = w_ptr + (col_rows * stride_wn)[:, None] + offs_k[None, :]
        up_ptrs = w_ptr + ((col_rows + N) * stride_wn)[:, None] + offs_k[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # SILU only
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            k = k0 + offs_k
            if SINGLE_STEP:  # one block a program (the launcher's rule): the tile loaded above
                w = gate_first
                if SILU:
                    w_up = up_first
            else:
                w = load_w_tile(gate_ptrs, k, K, EVEN_K)
                if SILU:
                    w_up = load_w_tile(up_ptrs, k, K, EVEN_K)
            for m in tl.static_range(BLOCK_M):
                row = tl.minimum(m, num_rows - 1)  # rows past num_rows: repeats, not stored
                if HAS_NORM:
                    rstd = tl.sum(tl.where(offs_m == row, rstd_rows, 0.0), axis=0)
                    xm = normed_chunk(x_ptr, res_ptr, norm_w_ptr, row, k, K, stride_xm, stride_rm, rstd,
                                       HAS_RESIDUAL)
                    if STORE_NORMED:  # float32 holding values of the dtype: stored exactly
                        tl.store(normed_ptr + row * K + k, xm.to(dtype), mask=(k < K) & ((block == 0) & (row == m)))
                elif EVEN_K:
                    xm = tl.load(x_ptr + row * stride_xm + k).to(tl.float32)
                else:
                    xm = tl.load(x_ptr + row * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
                acc = add_row_products(acc, w, xm, m, offs_m)
                if SILU:
                    acc_up = add_row_products(acc_up, w_up, xm, m, offs_m)
            gate_ptrs += BLOCK_K
            up_ptrs += BLOCK_K
        col_ok = cols < N
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            if SILU:
                acc_up += tl.load(bias_ptr + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if SILU:  # silu_and_mul.py's arithmetic on gate and up as the GEMV stores them
            gate = acc.to(dtype).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
            acc = silu * acc_up.to(dtype).to(tl.float32)
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + cols[None, :]
        tl.store(y_ptrs, acc.to(dtype), mask=(offs_m[:, None] < num_rows) & col_ok[None, :])


def _rows(t: torch.Tensor, k: int) -> torch.Tensor:
    rows = t.reshape(math.prod(t.shape[:-1]), k)  # a view for the usual [T, K] and for row-strided views
    return rows if rows.stride(1) == 1 or k <= 1 else rows.contiguous()


def _launch(x, residual, norm_weight, eps, weight, bias, silu: bool, config: GemvConfig | None,
            residual_out: torch.Tensor | None = None, normed_out: torch.Tensor | None = None):
    """Checks, the launch, and ``(y, x + residual or None)``."""
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}: it must be [N, {k}]")
    if weight.dtype != x.dtype or (norm_weight is not None and norm_weight.dtype != x.dtype):
        raise ValueError(f"x is {x.dtype} but a weight is not: the fused launch takes one dtype, convert them")
    if weight.stride(1) != 1 and k > 1:
        raise ValueError("the GEMV reads W rows as contiguous K: pass weight.contiguous()")
    n = weight.shape[0]
    if silu and n % 2:
        raise ValueError(f"SiLU-and-mul needs [gate; up] weights of an even row count, got {n}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias {tuple(bias.shape)} must be [{n}]")
    if norm_weight is not None and (norm_weight.shape != (k,) or k > MAX_SINGLE_PASS):
        raise ValueError(f"norm weight {tuple(norm_weight.shape)} must be [{k}], at most {MAX_SINGLE_PASS} "
                         "(longer rows: rms_norm then gemv)")
    if residual is not None and (tuple(residual.shape) != tuple(x.shape) or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    if normed_out is not None and (norm_weight is None or normed_out.shape != x.shape or normed_out.dtype != x.dtype
                                   or not normed_out.is_contiguous()):
        raise ValueError(f"normed_out {tuple(normed_out.shape)} {normed_out.dtype} must be contiguous, of x's shape "
                         f"{tuple(x.shape)} and dtype {x.dtype}, and there must be a norm to store")
    rows = _rows(x, k)
    num_rows, stride_xm = rows.shape[0], rows.stride(0)
    if num_rows > MAX_ROWS:
        raise ValueError(f"the fused GEMV takes at most {MAX_ROWS} rows, got {num_rows}: use the separate layers")
    n_out = n // 2 if silu else n
    out = torch.empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    res_out = None if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device) \
        if residual_out is None else checked_residual_out(residual_out, x)
    if num_rows == 0 or n_out == 0 or k == 0:
        if k == 0 and num_rows and n_out:
            raise ValueError("the fused GEMV needs K >= 1")
        if res_out is not None:
            res_out.copy_(x + residual)
        return out, res_out
    res_rows = _rows(residual, k) if residual is not None else rows
    if config is None and norm_weight is not None:
        config = config_after_rms_norm(n, k, weight.element_size(), num_sms(x.device), silu=silu)
    elif config is None:
        config = choose_config(n, k, weight.element_size(), num_sms(x.device))
    norm_block_m, norm_block_n, _, _ = norm_tiles(k, MAX_SINGLE_PASS)
    pdl = use_pdl(weight)
    num_blocks = triton.cdiv(n_out, config.block_n)
    single_step = config.block_k >= k
    persistent = config.programs_per_sm > 0 and not single_step  # a one-step tile is loaded for one block only
    num_programs = min(num_blocks, config.programs_per_sm * num_sms(x.device)) if persistent else num_blocks
    _norm_gemv_kernel[(num_programs,)](
        rows, res_rows, norm_weight if norm_weight is not None else weight, weight,
        bias if bias is not None else weight, out, res_out if res_out is not None else out,
        normed_out if normed_out is not None else out, num_rows, n_out, k, stride_xm, res_rows.stride(0),
        weight.stride(0), n_out, eps,
        BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_K=k % config.block_k == 0, HAS_BIAS=bias is not None, NUM_STAGES=config.num_stages,
        SINGLE_STEP=single_step, HAS_NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
        NORM_BLOCK_M=norm_block_m, NORM_BLOCK_N=norm_block_n, SILU=silu, STORE_NORMED=normed_out is not None,
        PREFETCH_LINES=prefetch_lines(config, k, weight.element_size(), pdl),
        num_warps=config.num_warps, num_stages=config.num_stages,
        USE_PDL=pdl, launch_pdl=pdl,
    )
    return out, res_out


def rms_norm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                  bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, silu: bool = False,
                  config: GemvConfig | None = None, residual_out: torch.Tensor | None = None,
                  normed_out: torch.Tensor | None = None):
    """``gemv(rms_norm(x, norm_weight, eps, residual), weight, bias)``, then ``silu_and_mul`` with ``silu``.

    Returns y, or ``(y, x + residual)`` with ``residual`` (like ``rms_norm``); the sum is a new tensor, or
    ``residual_out`` (contiguous, x's shape and dtype) where given. ``normed_out`` (the same): also filled with
    the norm's output, as ``rms_norm`` gives it, for layers after this one that read it.
    ``config`` defaults to ``config_after_rms_norm``'s, the tiles of the unfused GEMV after a norm.
    """
    y, summed = _launch(x, residual, norm_weight, eps, weight, bias, silu, config, residual_out, normed_out)
    return y if residual is None else (y, summed)


def gemv_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                      config: GemvConfig | None = None) -> torch.Tensor:
    """``silu_and_mul(gemv(x, weight, bias))`` for ``[gate; up]`` weights ``[2I, K]``: ``[..., I]``."""
    return _launch(x, None, None, 0.0, weight, bias, True, config)[0]
