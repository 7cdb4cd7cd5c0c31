"""Skinny GEMM for decode batches: ``y[M, N] = x[M, K] @ W[N, K]^T (+ bias)`` for M <= 8 rows.

At batch 1..8 a projection is a read of W and nothing else; cuBLAS's kernels for it leave most of
the H100's bandwidth unused (few loads in flight per SM, and a second split-K reduce launch). Here
every program owns ``BLOCK_N`` output columns (rows of W) and walks the whole of K, so each output
element is summed by one program in one fixed order: no split-K, no atomics, the same bits on every
run and in CUDA-graph replay. Accumulation is in float32; the output is rounded once to x's dtype
(after the bias is added, as cuBLAS's bias epilogue does).

The inner product is FMA on CUDA cores: per K tile, one ``[BLOCK_N, BLOCK_K]`` load of W and for
each row m a multiply by ``x[m]`` and a sum over K. Tiles can be as narrow as 4 columns, so N=1024
still gives 256 programs. Rows are padded to a power of two (the padding repeats the last row and is
not stored), so one compiled variant serves M=5..8 and the graphs' batch sizes 1, 2, 4, 8 need four.
A ``tl.dot`` variant for 3..8 rows was removed: it was further from the exact result and slower than
cuBLAS at 8 rows. The tiles come from (N, K) alone (no autotuning: it
would run inside graph capture); a GEMV whose x is an RMSNorm's output takes the tiles it also runs
fused with that norm (``config_after_rms_norm``, ``fused/norm_gemv.py``).

No kernel writes weights, so W may be read before waiting on the kernel before (PDL, ``fused/pdl.py``):
a program of one K step loads its whole tile into registers first; a program of several K steps asks
L2 for the W of its first ``prefetch_steps`` K steps (``prefetch.global.L2``, nothing into registers),
so the DRAM reads start while the kernel before drains and the K loop finds its first tiles in L2.
The loop itself is left as it is: which products the compiler contracts into FMAs depends on the
code around them, and a peeled first step compiled for sm_90 (Triton 3.9) rounded other products
than the loop at two rows, which would change the bits and part the fused kernels from this one.

``gemv_tile`` is that body (W loads, PDL wait, K loop, bias) up to the float32 tile; ``_gemv_kernel``
stores it, and a kernel that does something else with the tile (a tensor-parallel plugin's GEMV that
stores its partial sums straight into the other ranks' memory) calls it too: Triton inlines it, so the
sums are the same code.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv_tiles import (  # noqa: F401 - the tile choice, re-exported where it always was
    L2_LINE_BYTES,
    LARGE_K,
    NORM_GEMV_PROGRAMS_PER_SM,
    GemvConfig,
    _large_k_config,
    choose_config,
    config_after_rms_norm,
    num_sms,
    prefetch_lines,
    rms_norm_warps,
)
from infer_core.layers.fused.pdl import pdl_enter

MAX_ROWS = 8  # decode batches; more rows than this is a GEMM, F.linear's job


@triton.jit
def load_w_tile(w_ptrs, k, K, EVEN_K: tl.constexpr):
    """One ``[BLOCK_N, BLOCK_K]`` tile of W in float32 (the K tail masked to zero)."""
    if EVEN_K:
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=(k < K)[None, :], other=0.0)
    return w.to(tl.float32)


@triton.jit
def prefetch_w_to_l2(w_ptr, w_rows, K, NUM_LINES: tl.constexpr):
    """Ask L2 for the first ``NUM_LINES`` 128-byte lines of each of this program's W rows, without waiting.

    ``w_rows``: the rows' offsets in elements. Lines past K are clamped onto the row's last element
    (the same line again), so no address leaves W. Loads nothing into registers: the code that sums is
    untouched. On CUDA only (inline PTX): the launchers ask for it with PDL, which the interpreter never has.
    """
    line = L2_LINE_BYTES // (w_ptr.dtype.element_ty.primitive_bitwidth // 8)
    offs = tl.minimum(tl.arange(0, NUM_LINES) * line, K - 1)
    ptrs = w_ptr + w_rows[:, None] + offs[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def add_row_products(acc, w, x_row, m, offs_m):
    """``acc[m, :] += w @ x_row`` over one K tile: the one place a GEMV sums, shared by every GEMV kernel.

    The fused kernels (``fused/norm_gemv.py``) call it on the same tiles, so their column sums are the
    plain GEMV's bit for bit.
    """
    part = tl.sum(w * x_row[None, :], axis=1)
    return tl.where(offs_m[:, None] == m, acc + part[None, :], acc)


@triton.jit
def gemv_tile(x_ptr, w_ptr, bias_ptr, num_rows, N, K, stride_xm, stride_wn, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
              NUM_STAGES: tl.constexpr, SINGLE_STEP: tl.constexpr, PREFETCH_LINES: tl.constexpr,
              USE_PDL: tl.constexpr):
    """This program's tile of ``x @ W^T (+ bias)`` in float32, ``[BLOCK_M, BLOCK_N]``: rows ``arange(BLOCK_M)``
    (those past ``num_rows`` repeat the last row), columns ``program_id(0) * BLOCK_N + arange(BLOCK_N)``.

    Every GEMV kernel's body: it loads (or asks L2 for) its first W before the PDL wait, waits, walks K, and
    leaves the tile to its caller, which stores it (``_gemv_kernel``) or sends it elsewhere (a tensor-parallel
    plugin's GEMV, to the other ranks). Triton inlines it, so each caller compiles to the code of one kernel.
    """
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    # the last program's columns past N re-read row N-1 (in bounds, no mask on W) and are not stored
    w_rows = tl.minimum(cols, N - 1).to(tl.int64) * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    w_ptrs = w_ptr + w_rows[:, None] + offs_k[None, :]
    if SINGLE_STEP:  # no kernel writes weights: the whole tile may load while the kernel before drains
        w_first = load_w_tile(w_ptrs, offs_k, K, EVEN_K)
    if PREFETCH_LINES > 0:  # several steps: the first ones' W streams into L2 meanwhile
        prefetch_w_to_l2(w_ptr, w_rows, K, PREFETCH_LINES)
    pdl_enter(USE_PDL)  # before any other load or store: see fused/pdl.py
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # an explicit loop stage count lets Triton pipeline loads that feed no dot (cp.async into shared memory)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + offs_k
        if SINGLE_STEP:
            w = w_first
        else:
            w = load_w_tile(w_ptrs, k, K, EVEN_K)
        for m in tl.static_range(BLOCK_M):
            x_row = x_ptr + tl.minimum(m, num_rows - 1) * stride_xm  # rows past num_rows: repeats, not stored
            if EVEN_K:
                xm = tl.load(x_row + k)
            else:
                xm = tl.load(x_row + k, mask=k < K, other=0.0)
            acc = add_row_products(acc, w, xm.to(tl.float32), m, offs_m)
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit(do_not_specialize=["num_rows"])
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, num_rows, N, K, stride_xm, stride_wn, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, NUM_STAGES: tl.constexpr, SINGLE_STEP: tl.constexpr,
                 PREFETCH_LINES: tl.constexpr, USE_PDL: tl.constexpr):
    """``y = x @ W^T (+ bias)``, rounded once to y's dtype."""
    acc = gemv_tile(x_ptr, w_ptr, bias_ptr, num_rows, N, K, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                    HAS_BIAS, NUM_STAGES, SINGLE_STEP, PREFETCH_LINES, USE_PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < num_rows) & (cols[None, :] < N))


def checked_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x as ``[rows, K]`` with contiguous K, after checking that x, W and bias fit the GEMV kernels."""
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}: it must be [N, {k}]")
    if weight.dtype != x.dtype:
        raise ValueError(f"x is {x.dtype} but the weight is {weight.dtype}: convert one of them")
    if weight.stride(1) != 1 and weight.shape[1] > 1:
        raise ValueError("gemv reads W rows as contiguous K: pass weight.contiguous()")
    n = weight.shape[0]
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias {tuple(bias.shape)} must be [{n}]")
    rows = x.reshape(math.prod(x.shape[:-1]), k)  # a view for the usual [T, K] and for row-strided views
    if rows.shape[0] > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {rows.shape[0]}: use F.linear")
    if rows.stride(1) != 1 and k > 1:
        rows = rows.contiguous()
    return rows


def tile_constexprs(cfg: GemvConfig, num_rows: int, k: int, element_size: int, pdl: bool) -> dict:
    """``gemv_tile``'s compile-time arguments (and the launch's warps and stages) for ``num_rows`` rows of ``k``."""
    return dict(BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                EVEN_K=k % cfg.block_k == 0, NUM_STAGES=cfg.num_stages, SINGLE_STEP=cfg.block_k >= k,
                PREFETCH_LINES=prefetch_lines(cfg, k, element_size, pdl), num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, USE_PDL=pdl, launch_pdl=pdl)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         config: GemvConfig | None = None, after_rms_norm: bool = False, before_silu: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for at most ``MAX_ROWS`` rows of x; a new tensor ``[..., N]``.

    ``after_rms_norm``: x is an RMSNorm's output, and the tiles are :func:`config_after_rms_norm`'s
    (``before_silu``: for ``[gate; up]`` weights whose output goes to SiLU-and-mul, its ``silu`` tiles).
    """
    rows = checked_rows(x, weight, bias)
    num_rows, k = rows.shape
    n = weight.shape[0]
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    if num_rows == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand_as(out))
    if config is None and after_rms_norm:
        config = config_after_rms_norm(n, k, x.element_size(), num_sms(x.device), silu=before_silu)
    cfg = config or choose_config(n, k, x.element_size(), num_sms(x.device))
    _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        rows, weight, bias if bias is not None else weight, out, num_rows, n, k, rows.stride(0), weight.stride(0), n,
        HAS_BIAS=bias is not None, **tile_constexprs(cfg, num_rows, k, rows.element_size(), use_pdl(rows)),
    )
    return out
