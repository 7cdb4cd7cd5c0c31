"""Split-K GEMM for decode batches of 3-256 rows: ``y[M, N] = x[M, K] @ W[N, K]^T (+ bias)``, one launch.

Why: at M <= 256 the projections of small models (2-12 MB of W) take cuBLAS ~2.6x their ideal time
on an H100: the output tiles alone make 32-200 programs for 132 SMs, each walking all of K. Here
the grid is (output tiles) x (K splits): a program computes its tile's float32 partial over one
slice of K with ``tl.dot`` (wgmma). With several splits it writes the partial to scratch, and an
atomic counter per tile (acq_rel) picks the last program of the tile to arrive: it sums the
partials in split order, element by element (the bits depend neither on which program came last
nor on thread layouts: the same every run and in graph replay), adds the bias, rounds once, stores,
and zeroes the counter for the next launch. At <= 64 rows the tile is W @ x^T (``swap_ab``: W's
rows fill wgmma's 64-row side, x's few rows its narrow side).

Tiles come from (M, N, K) alone (``TUNED`` from ``python -m benchmarks.gemm --sweep``, else a
heuristic): no autotuning, which would run inside graph capture. Scratch is per device, grow-only,
never freed (captured graphs keep its address) and never allocated inside a capture (the runner
warms up each size first); calls on one device must not overlap on two streams. Every program
waits on the kernel before it (PDL, ``fused/pdl.py``) before any load.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv import num_sms
from infer_core.layers.fused.pdl import pdl_enter

MAX_SPLITS = 16
MIN_SPLIT_K = 256  # K elements a split walks at least: fewer and the merge outweighs the parallelism
MERGE_VALUES_PER_THREAD = 64  # float32 partial values a thread holds per merge chunk, all splits together


@dataclass(frozen=True, slots=True)
class GemmConfig:
    block_m: int  # rows of x per tile (the narrow side of the dot when swap_ab)
    block_n: int  # rows of W (output columns) per tile
    block_k: int
    split_k: int  # programs per output tile, each over its own slice of K
    swap_ab: bool  # compute the tile as W @ x^T: the tile's rows are W's
    num_warps: int
    num_stages: int


# (N, K) -> ((largest M, config), ...) ascending in M; measured on an H100 by benchmarks/gemm.py --sweep.
TUNED: dict[tuple[int, int], tuple[tuple[int, GemmConfig], ...]] = {}


@triton.jit
def _merge_partials(part_ptr, y_ptr, bias_ptr, row0, col0, M, N, stride_ym, SPLIT_K: tl.constexpr,
                    ROWS: tl.constexpr, COLS: tl.constexpr, MERGE_ROWS: tl.constexpr, SWAP_AB: tl.constexpr,
                    HAS_BIAS: tl.constexpr):
    """Sum one tile's SPLIT_K partials (``[SPLIT_K, ROWS, COLS]`` float32 at part_ptr) in split order; store y.

    Loads skip L1 (``.cg``): other SMs wrote the partials.
    """
    cols = tl.arange(0, COLS)
    for r0 in range(0, ROWS, MERGE_ROWS):
        rows = r0 + tl.arange(0, MERGE_ROWS)
        ptrs = part_ptr + rows[:, None] * COLS + cols[None, :]
        total = tl.load(ptrs, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):  # unrolled: the loads are independent, ptxas issues them early
            total += tl.load(ptrs + s * ROWS * COLS, cache_modifier=".cg")
        _store_tile(total, y_ptr, bias_ptr, row0 + rows, col0 + cols, M, N, stride_ym, SWAP_AB, HAS_BIAS)


@triton.jit
def _store_tile(acc, y_ptr, bias_ptr, rows, cols, M, N, stride_ym, SWAP_AB: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Add the bias, round once to y's dtype, store the tile (rows are W's when SWAP_AB, else x's)."""
    if SWAP_AB:
        offs_n, offs_m = rows[:, None], cols[None, :]
    else:
        offs_m, offs_n = rows[:, None], cols[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_m * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M) & (offs_n < N))


@triton.jit(do_not_specialize=["M"])
def _gemm_splitk_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, part_ptr, tile_counts_ptr,
    M, N, K, stride_xm, stride_wn, stride_ym, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    SWAP_AB: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, MERGE_ROWS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    tile = tl.program_id(0)
    split = tl.program_id(1)
    num_m_tiles = tl.cdiv(M, BLOCK_M)
    pid_m = tile % num_m_tiles  # the M tiles of one W slice are neighbours: they run together and share it in L2
    pid_n = tile // num_m_tiles
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows past M (W rows past N) re-read the last one, in bounds without a mask, and are not stored
    x_rows = tl.minimum(offs_m, M - 1).to(tl.int64) * stride_xm
    w_rows = tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    offs_k = k_lo + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + x_rows[:, None] + offs_k[None, :]
    w_ptrs = w_ptr + w_rows[:, None] + offs_k[None, :]
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:  # only the last K tile of the last split has a tail
            in_k = (offs_k < K)[None, :]
            x = tl.load(x_ptrs, mask=in_k, other=0.0)
            w = tl.load(w_ptrs, mask=in_k, other=0.0)
        if UPCAST:  # the interpreter's dot reads bfloat16 operands as raw bits: multiply in float32
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        offs_k += BLOCK_K

    ROWS: tl.constexpr = BLOCK_N if SWAP_AB else BLOCK_M  # the accumulator's shape
    COLS: tl.constexpr = BLOCK_M if SWAP_AB else BLOCK_N
    row0 = pid_n * BLOCK_N if SWAP_AB else pid_m * BLOCK_M
    col0 = pid_m * BLOCK_M if SWAP_AB else pid_n * BLOCK_N
    if SPLIT_K == 1:
        _store_tile(acc, y_ptr, bias_ptr, row0 + tl.arange(0, ROWS), col0 + tl.arange(0, COLS), M, N, stride_ym,
                    SWAP_AB, HAS_BIAS)
    else:
        parts = part_ptr + tile.to(tl.int64) * (SPLIT_K * ROWS * COLS)
        r, c = tl.arange(0, ROWS), tl.arange(0, COLS)
        tl.store(parts + split * (ROWS * COLS) + r[:, None] * COLS + c[None, :], acc)
        # The barrier puts every thread's stores above before the release of the count; the acquire
        # of the program that counts last makes all the tile's partials visible to it.
        tl.debug_barrier()
        counter = tile_counts_ptr + tile
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            _merge_partials(parts, y_ptr, bias_ptr, row0, col0, M, N, stride_ym, SPLIT_K, ROWS, COLS, MERGE_ROWS,
                            SWAP_AB, HAS_BIAS)
            tl.store(counter, 0)  # every split has counted: zero for the next launch (and graph replay)


def normalized_splits(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(splits, K elements per split) with every split non-empty and a whole number of K tiles."""
    k_tiles = triton.cdiv(k, block_k)
    tiles_per_split = triton.cdiv(k_tiles, max(1, min(split_k, k_tiles)))
    return triton.cdiv(k_tiles, tiles_per_split), tiles_per_split * block_k


@functools.lru_cache(maxsize=4096)  # called per linear layer per eager step: keep it a dict lookup
def choose_config(m: int, n: int, k: int, element_size: int, num_sms: int) -> GemmConfig:
    """Tiles and splits for one shape, from the shape alone: ``TUNED`` where measured, else a heuristic.

    Heuristic: up to 64 rows, W @ x^T on 64 W rows x (x's rows, at least 16) with 128-wide K steps
    (the W tile is most of the bytes); beyond, 128-row x tiles by 128 (64 where that leaves less than a
    wave of tiles) W rows. Splits: none where the tiles fill 3/4 of the SMs, else enough for about one
    wave, each split at least ``MIN_SPLIT_K`` long. Four operand stages in flight (two for float32 operands).
    """
    for max_m, cfg in TUNED.get((n, k), ()):
        if m <= max_m:
            return cfg
    if os.environ.get("TRITON_INTERPRET") == "1":  # numpy runs every program: small tiles keep CPU tests fast
        return GemmConfig(16, 16, 16, split_k=2, swap_ab=False, num_warps=1, num_stages=1)
    if m <= 64:
        block_m, block_n, block_k, swap_ab = max(16, triton.next_power_of_2(m)), 64, 128, True
    else:
        block_m, block_k, swap_ab = 128, 64, False
        block_n = 128 if triton.cdiv(m, 128) * triton.cdiv(n, 128) >= num_sms else 64
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split_k = 1
    if 4 * tiles < 3 * num_sms:
        split_k = max(1, min(MAX_SPLITS, triton.cdiv(num_sms, tiles), k // MIN_SPLIT_K))
    split_k, _ = normalized_splits(k, block_k, split_k)
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    return GemmConfig(block_m, block_n, block_k, split_k, swap_ab, num_warps, num_stages=4 if element_size <= 2 else 2)


@dataclass(slots=True)
class SplitKScratch:
    """Partials of the split tiles and a counter per tile (zero between launches: the last program resets it)."""

    partials: torch.Tensor  # float32, flat: [tiles, splits, tile rows, tile cols]
    tile_counts: torch.Tensor  # int32 [tiles]

    @classmethod
    def allocate(cls, num_partials: int, num_tiles: int, device: torch.device) -> SplitKScratch:
        return cls(torch.empty(num_partials, dtype=torch.float32, device=device),
                   torch.zeros(num_tiles, dtype=torch.int32, device=device))

    def fits(self, num_partials: int, num_tiles: int) -> bool:
        return self.partials.numel() >= num_partials and self.tile_counts.numel() >= num_tiles


_scratch: dict[torch.device, list[SplitKScratch]] = {}  # per device, grown (never freed: graphs hold addresses)


def device_scratch(device: torch.device, num_partials: int, num_tiles: int) -> SplitKScratch:
    """The device's newest scratch, or a larger one (twice what is asked, so it grows rarely)."""
    held = _scratch.setdefault(device, [])
    if held and held[-1].fits(num_partials, num_tiles):
        return held[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"gemm_splitk needs {num_partials} partials and {num_tiles} counters of scratch, "
                           "more than any call made before this CUDA-graph capture: run the GEMM once at this "
                           "shape before capturing (a warm-up), or pass scratch=")
    grown = SplitKScratch.allocate(2 * num_partials, 2 * num_tiles, device)
    held.append(grown)
    return grown


def gemm_splitk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                config: GemmConfig | None = None, scratch: SplitKScratch | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with float32 accumulation; a new tensor ``[..., N]`` of x's dtype."""
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}: it must be [N, {k}]")
    if weight.dtype != x.dtype:
        raise ValueError(f"x is {x.dtype} but the weight is {weight.dtype}: convert one of them")
    if weight.stride(1) != 1 and k > 1:
        raise ValueError("gemm_splitk reads W rows as contiguous K: pass weight.contiguous()")
    n = weight.shape[0]
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias {tuple(bias.shape)} must be [{n}]")
    rows = x.reshape(math.prod(x.shape[:-1]), k)
    if rows.stride(1) != 1 and k > 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand_as(out))
    cfg = config or choose_config(m, n, k, x.element_size(), num_sms(x.device))
    split_k, k_per_split = normalized_splits(k, cfg.block_k, cfg.split_k)
    num_tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    tile_values = cfg.block_m * cfg.block_n
    if split_k > 1:
        scratch = scratch or device_scratch(x.device, num_tiles * split_k * tile_values, num_tiles)
        if not scratch.fits(num_tiles * split_k * tile_values, num_tiles):
            raise ValueError(f"scratch too small for {num_tiles} tiles x {split_k} splits of {tile_values} values")
        partials, tile_counts = scratch.partials, scratch.tile_counts
    else:
        partials = tile_counts = out  # unused by the kernel with one split
    tile_cols = cfg.block_m if cfg.swap_ab else cfg.block_n
    merge_values = max(1, MERGE_VALUES_PER_THREAD // split_k) * 32 * cfg.num_warps
    merge_rows = min(tile_values // tile_cols, triton.next_power_of_2(max(1, merge_values // tile_cols)))
    pdl = use_pdl(x)
    _gemm_splitk_kernel[(num_tiles, split_k)](
        rows, weight, bias if bias is not None else weight, out, partials, tile_counts,
        m, n, k, rows.stride(0), weight.stride(0), n, k_per_split,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split_k, SWAP_AB=cfg.swap_ab,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None, MERGE_ROWS=merge_rows,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=os.environ.get("TRITON_INTERPRET") == "1" and x.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, USE_PDL=pdl, launch_pdl=pdl,
    )
    return out
