"""Tensor-core GEMM for decode batches past the GEMV: ``y[M, N] = x[M, K] @ W[N, K]^T (+ bias)``, M of tens to 256.

Why: in a large decode batch a projection still mostly reads W (a Qwen3-0.6B layer's four matrices
are 30 MB), yet at 188 rows cuBLAS took 28 us a layer on an H100 where W at copy bandwidth takes ~10
(``benchmarks/results/offline-throughput-session10-profile-decode-*``): its tiles for these shapes
leave SMs idle (N=1024 and 64-row tiles make 48 tiles for 132 SMs) and it waits for the kernel
before it to drain (no programmatic dependent launch).

Here a program computes one ``[BLOCK_M, BLOCK_N]`` tile of y over one of ``SPLIT_K`` slices of K
with ``tl.dot`` (float32 accumulation). Programs of one W tile are adjacent in launch order, so W
comes from HBM once and the other row tiles find it in L2. With ``SPLIT_K`` > 1 every program stores
its float32 partial tile; the last of a tile's programs to finish (an atomic count, reset to zero
for the next launch) adds the slices in slice order and writes y: no atomics on y, the same bits on
every run and in graph replay. Rows past M re-read row M-1 (no mask on x) and are not stored; so
are columns past N.

The tiles come from the shape (``choose_config``, measured by ``python -m benchmarks.gemm --sweep``),
never from autotuning, which would run inside graph capture.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv import prefetch_w_to_l2
from infer_core.layers.fused.pdl import pdl_enter
from infer_core.layers.split_counters import SplitCounters

_COUNTERS = SplitCounters("GEMM")  # one per output tile of a split-K launch


@dataclass(frozen=True, slots=True)
class GemmConfig:
    block_m: int  # rows of x (tokens) per program
    block_n: int  # output columns (rows of W) per program
    block_k: int  # K elements per loop step
    split_k: int  # slices of K, each summed by its own program (1: no split)
    num_warps: int
    num_stages: int  # K steps in flight
    # with PDL: the first row tile's programs ask L2 for their whole slice of W before waiting on the kernel
    # before, so the DRAM reads of W overlap that kernel's last programs (the loop then finds W in L2)
    prefetch: bool = True

    def fits(self, k: int) -> bool:
        """Whether K splits into ``split_k`` slices of whole ``block_k`` steps (the kernel has no K mask)."""
        return k % (self.split_k * self.block_k) == 0


@triton.jit
def _sum_slices(partial_ptr, tile_offsets, mask, slice_stride, SPLIT_K: tl.constexpr):
    """The K slices' partial tiles added in slice order (``.cg``: other SMs wrote them, not this one's L1)."""
    total = tl.load(partial_ptr + tile_offsets, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT_K):
        total += tl.load(partial_ptr + s * slice_stride + tile_offsets, mask=mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit(do_not_specialize=["num_rows"])
def _gemm_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    partial_ptr,
    counter_ptr,
    num_rows,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    tile = tl.program_id(0)
    num_m_tiles = tl.cdiv(num_rows, BLOCK_M)
    m_tile = tile % num_m_tiles  # a W tile's programs are neighbours: its other row tiles read it from L2
    n_tile = tile // num_m_tiles
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    k_per_split = K // SPLIT_K
    offs_k = tl.program_id(1) * k_per_split + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tl.minimum(rows, num_rows - 1).to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_rows = tl.minimum(cols, N - 1).to(tl.int64) * stride_wn
    w_ptrs = w_ptr + w_rows[:, None] + offs_k[None, :]
    if PREFETCH_LINES > 0:
        if m_tile == 0:  # one program per W tile asks; the other row tiles' programs find the lines in flight
            prefetch_w_to_l2(w_ptr + tl.program_id(1) * k_per_split, w_rows, k_per_split, PREFETCH_LINES)
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        acc = tl.dot(tl.load(x_ptrs), tl.trans(tl.load(w_ptrs)), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = (rows < num_rows)[:, None] & (cols < N)[None, :]
    if SPLIT_K > 1:
        tile_offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
        slice_stride = num_rows.to(tl.int64) * N
        tl.store(partial_ptr + tl.program_id(1) * slice_stride + tile_offsets, acc, mask=mask)
        # The barrier puts every thread's stores above before the release of the count; the acquire of the
        # program that counts last makes every slice's partial tile visible to it.
        tl.debug_barrier()
        if tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            acc = _sum_slices(partial_ptr, tile_offsets, mask, slice_stride, SPLIT_K)
            if HAS_BIAS:
                acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)
            tl.store(counter_ptr + tile, 0)  # every slice has counted: zero for the next launch (and graph replay)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=4096)  # called per linear layer per eager step: keep it a dict lookup
def choose_config(num_rows: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """Tiles for one shape, from the shape alone (the same choice eagerly and under graph capture).

    Row tiles of 64 (the tensor cores' M per warp group), or 32 below 64 rows, so padding wastes
    little; 64 columns; K steps of 64 in 4 stages. K is split (2, then 4) while the tiles alone would
    leave more than a third of the SMs without a program, and the split keeps whole K steps.
    """
    block_m = 32 if num_rows <= 32 else 64
    block_n, block_k = 64, 64
    tiles = triton.cdiv(num_rows, block_m) * triton.cdiv(n, block_n)
    split_k = 1
    while split_k < 4 and tiles * split_k < 2 * num_sms // 3 and k % (2 * split_k * block_k) == 0:
        split_k *= 2
    return GemmConfig(block_m, block_n, block_k, split_k, num_warps=4, num_stages=4)


def _checked_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x as ``[rows, K]`` with contiguous K, after checking that x, W and bias fit the kernel."""
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}: it must be [N, {k}]")
    if weight.dtype != x.dtype:
        raise ValueError(f"x is {x.dtype} but the weight is {weight.dtype}: convert one of them")
    if weight.stride(1) != 1 and k > 1:
        raise ValueError("gemm reads W rows as contiguous K: pass weight.contiguous()")
    n = weight.shape[0]
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias {tuple(bias.shape)} must be [{n}]")
    rows = x.reshape(-1, k)  # a view for the usual [T, K] and for row-strided views
    if rows.stride(1) != 1 and k > 1:
        rows = rows.contiguous()
    return rows


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         config: GemmConfig | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on the tensor cores; a new tensor ``[..., N]`` of x's dtype."""
    from infer_core.layers.fused.gemv import num_sms

    rows = _checked_rows(x, weight, bias)
    num_rows, k = rows.shape
    n = weight.shape[0]
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    if num_rows == 0 or n == 0:
        return out
    cfg = config or choose_config(num_rows, n, k, num_sms(x.device))
    if not cfg.fits(k):
        raise ValueError(f"K={k} is not {cfg.split_k} slices of whole {cfg.block_k}-wide steps: "
                         "use F.linear for this shape (dense.use_gemm checks it)")
    num_tiles = triton.cdiv(num_rows, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if cfg.split_k > 1:
        partial = torch.empty((cfg.split_k, num_rows, n), dtype=torch.float32, device=x.device)
        counters = _COUNTERS.get(x.device, num_tiles)
    else:
        partial = counters = out  # not read without SPLIT_K
    pdl = use_pdl(rows)
    line = 128 // x.element_size()  # elements of a 128-byte L2 line
    prefetch_lines = triton.next_power_of_2(triton.cdiv(k // cfg.split_k, line)) if pdl and cfg.prefetch else 0
    _gemm_kernel[(num_tiles, cfg.split_k)](
        rows, weight, bias if bias is not None else weight, out, partial, counters, num_rows, n, k,
        rows.stride(0), weight.stride(0), n,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        HAS_BIAS=bias is not None, NUM_STAGES=cfg.num_stages, PREFETCH_LINES=prefetch_lines, USE_PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )
    return out
