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
A ``tl.dot`` variant for 3..8 rows was measured on an H100 and removed: it was 4 fp16 steps off the
exact result and slower than cuBLAS at 8 rows. The tiles come from (N, K) alone (no autotuning: it
would run inside graph capture); a GEMV whose x is an RMSNorm's output takes the tiles it also runs
fused with that norm (``config_after_rms_norm``, ``fused/norm_gemv.py``).

No kernel writes weights, so W may be read before waiting on the kernel before (PDL, ``fused/pdl.py``):
a program of one K step loads its whole tile into registers first; a program of several K steps asks
L2 for the W of its first ``prefetch_steps`` K steps (``prefetch.global.L2``, nothing into registers),
so the DRAM reads start while the kernel before drains and the K loop finds its first tiles in L2.
The loop itself is left as it is: which products the compiler contracts into FMAs depends on the
code around them, and a peeled first step compiled for sm_90 (Triton 3.9) rounded other products
than the loop at two rows, which would change the bits and part the fused kernels from this one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from infer_core.interfaces import PushTarget
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.pdl import pdl_enter
from infer_core.layers.fused.pushed_sums import add_pushed_block, adding_block, push_tile
from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS
from infer_core.layers.fused.rms_norm import _tiles as norm_tiles
from infer_core.layers.partial_sums import checked_values_per_word, values_per_word

LARGE_K = 4096  # from this K on, the large-K tiles of choose_config
# There: 8 columns by 1024 at 8 warps. The H100's standalone sweep had chosen 32 KiB tiles at 16 warps (8 by 2048);
# in whole decode steps on H200s the 8-warp tiles took Qwen3-8B from 4.599 to 4.565 ms with down_proj's alone
# (4.584 o_proj's, 4.596 the LM head's: decode-tiles-per-shape-* logs; 4.625 -> 4.573 all three, another run:
# decode-plain-gemv-large-k-8-warps-* log) and one TP=2 rank's pushed down_proj from 2.959 to 2.932 ms.
LARGE_K_TILE = 8192  # elements of W a program loads per K step there (16 KiB of bf16)
LARGE_K_WARPS = 8
# After a norm, tiles of several K steps run persistent at 2 programs an SM. On the H100, a Qwen3-8B decode
# step's projections (benchmarks.gemv --step) took 5,562 us with a program a block, 5,712 / 5,419 / 5,445 at
# 1 / 2 / 4 programs an SM; asking L2 for each block's first K step after the PDL wait lost at every count.
# (Those were 16-warp programs, of which one fits an SM: two waves. At the 8 warps of config_after_rms_norm's
# large-K tiles both fit; on an H200, 1 / 3 / 4 programs an SM and blocks handed out by an atomic counter
# were each slower than 2 for one TP=2 rank's share of Qwen3-8B: decode-persistent-norm-gemv-* logs.)
NORM_GEMV_PROGRAMS_PER_SM = 2
MAX_ROWS = 8  # decode batches; more rows than this is a GEMM, F.linear's job
PROGRAMS_PER_SM = 2  # at least two programs an SM: one loads while the other sums
TILE_BYTES = 16 << 10  # W bytes one program loads per K step: 64 bf16 values a thread at 4 warps
VALUES_PER_THREAD = 64  # W values a thread holds per K step
INTERPRETER_SMS = 4  # on the CPU (TRITON_INTERPRET=1) there is no device to ask; small grids run faster
L2_LINE_BYTES = tl.constexpr(128)  # what one prefetch.global.L2 asks for


@dataclass(frozen=True, slots=True)
class GemvConfig:
    block_n: int  # output columns (rows of W) per program
    block_k: int  # K elements per loop step
    num_warps: int
    num_stages: int  # K steps in flight (1: no software pipelining)
    # several K steps: the first ones' W asked of L2 before the PDL wait (0: none). Off at large K: on the H100
    # one Qwen3-8B decode step's projections took 5,536 us at 0, 5,560 at 1, 5,746 at 2 (benchmarks.gemv
    # --step); 1 below it (choose_config)
    prefetch_steps: int = 0
    # fused/norm_gemv.py only, for tiles of several K steps: > 0, a persistent launch of that many programs an
    # SM, each walking column blocks, so the norm's prologue runs once a program rather than once a block. No bit
    # changes: each block's sums are the same code on the same tiles. See NORM_GEMV_PROGRAMS_PER_SM.
    programs_per_sm: int = 0


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


@triton.jit(do_not_specialize=["num_rows"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    num_rows,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    push_dest_ptrs,
    slots_ptr,
    slot_words,
    sum_ptr,
    abort_ptr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SINGLE_STEP: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    USE_PDL: tl.constexpr,
    PUSH_RANKS: tl.constexpr,
    PUSH_VALUES_PER_WORD: tl.constexpr,
    ADD_PROGRAMS: tl.constexpr,
    ADD_BLOCK: tl.constexpr,
):
    """``y = x @ W^T (+ bias)``; with ``PUSH_RANKS`` > 0, y is pushed as this rank's words of a site to every
    rank instead, ``y_ptr`` being this rank's slot here (``fused/pushed_sums.py``), and with ``ADD_PROGRAMS``
    > 0 the last that many programs then add every rank's words into ``sum_ptr`` (mode ``gemv``)."""
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
    if PUSH_RANKS > 0:
        round_ = push_tile(acc, offs_m, tl.program_id(0) * BLOCK_N, num_rows, N, push_dest_ptrs, y_ptr,
                           x_ptr.dtype.element_ty, PUSH_VALUES_PER_WORD, BLOCK_M, BLOCK_N, PUSH_RANKS)
        if ADD_PROGRAMS > 0:  # the last programs (the last to start) add the ranks' words: no sum launch
            block = tl.program_id(0) - (tl.num_programs(0) - ADD_PROGRAMS)
            if block >= 0:
                add_pushed_block(slots_ptr, slot_words, sum_ptr, block, num_rows, N, round_, abort_ptr, PUSH_RANKS,
                                 x_ptr.dtype.element_ty, PUSH_VALUES_PER_WORD, ADD_BLOCK)
    else:
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + cols[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < num_rows) & (cols[None, :] < N))


@functools.lru_cache(maxsize=4096)  # called per linear layer per eager step: keep it a dict lookup
def choose_config(n: int, k: int, element_size: int, num_sms: int, num_warps: int | None = None) -> GemvConfig:
    """Tiles for one shape, from the shape alone (the same choice eagerly and under graph capture).

    The figure that matters is W bytes in flight per SM. Columns: the widest ``BLOCK_N`` of 16, 8, 4
    that still gives ``PROGRAMS_PER_SM`` programs an SM (N=1024 -> 4 columns, 256 programs), so no SM
    idles and a program can be loading while another on its SM sums. K: a 16 KiB W tile a step, 64
    values a thread (4 warps at 16 KiB). All of K in one step where K is a power of two that 4 or more
    columns leave room for (the narrower tile if need be: the kernels load a one-step tile before waiting
    on the kernel before them, so W streams in while that one drains); else as wide as the columns leave,
    shrunk to a power of two dividing K where one >= 256 does (K=3072 -> 1024: no masked tail), and a
    program of several K steps keeps two more in flight (3 stages: cp.async into shared memory). From
    ``LARGE_K`` on, 8 columns by 1024 at 8 warps (``LARGE_K_TILE``). The row count does not change the
    choice. ``python -m benchmarks.gemv --sweep`` times the alternatives.

    ``num_warps`` pins the warp count (a GEMV after an RMSNorm runs at the norm's: see
    :func:`config_after_rms_norm`); the tile is then 64 values a thread at that count, at any K.
    """
    enough_programs = [b for b in (16, 8, 4) if triton.cdiv(n, b) >= PROGRAMS_PER_SM * num_sms]
    block_n = enough_programs[0] if enough_programs else 4
    whole_k = triton.next_power_of_2(k)
    if k >= LARGE_K and num_warps is None:  # K of 4096 and more (8B-class models): see LARGE_K_TILE
        block_n = 8 if 8 in enough_programs else 4
        block_k = min(LARGE_K_TILE // block_n, whole_k)
        while block_k > 256 and k % block_k:
            block_k //= 2
        return GemvConfig(block_n, block_k, num_warps=LARGE_K_WARPS, num_stages=1)
    tile = num_warps * 32 * VALUES_PER_THREAD if num_warps is not None else TILE_BYTES // element_size
    # all of K in one step where a tile of 4 columns or more holds it (a plain GEMV's K a power of two: no masked
    # lanes): the tile loads before the PDL wait, while the kernel before drains (and before a fused norm's
    # prologue). One TP=2 rank's share of Qwen3-8B on one H200 took 2.737 ms a step with o_proj (K=2048) in one
    # step of 4 columns, 3.023 in two of 8; Qwen3-8B 4.447 with qkv so after its norm, 4.599 (decode-tiles-per-shape-*)
    one_step = [b for b in (16, 8, 4) if b * whole_k <= tile and (num_warps is not None or whole_k == k)]
    if one_step:
        block_n = next((b for b in one_step if b in enough_programs), one_step[-1])
        if num_warps is None:
            num_warps = max(1, min(8, block_n * whole_k // (32 * VALUES_PER_THREAD)))
        return GemvConfig(block_n, whole_k, num_warps=num_warps, num_stages=1)
    block_k = min(tile // block_n, whole_k)
    while block_k > 256 and k % block_k:
        block_k //= 2
    if num_warps is None:
        num_warps = max(1, min(8, block_n * block_k // (32 * VALUES_PER_THREAD)))
    num_stages = 1 if block_k >= k else 3
    # below the large-K tiles, a program of several K steps asks L2 for its first one before the PDL wait:
    # a Qwen3-0.6B batch-1 decode graph (down_proj, K=3072) replayed in 881.9 us without, 871.8 with
    # (benchmarks.graph_kernels on the H100; 872.6 with all three steps). At large K it lost (above).
    prefetch_steps = 1 if num_stages > 1 else 0
    return GemvConfig(block_n, block_k, num_warps=num_warps, num_stages=num_stages, prefetch_steps=prefetch_steps)


def prefetch_lines(config: GemvConfig, k: int, element_size: int, pdl: bool) -> int:
    """L2 lines of each W row a program asks for before the PDL wait (a power of two; 0: none).

    Only with PDL (without it the kernel before has drained when this one starts, and the loop's own
    loads are as early) and only for programs of several K steps (one step loads its tile into registers).
    """
    if not pdl or config.block_k >= k or config.prefetch_steps <= 0:
        return 0
    num_bytes = min(k, config.prefetch_steps * config.block_k) * element_size
    return triton.next_power_of_2(triton.cdiv(num_bytes, L2_LINE_BYTES.value))


def rms_norm_warps(k: int) -> int | None:
    """The warps of ``fused/rms_norm.py``'s kernel on rows of ``k`` (None: rows it normalises in two passes)."""
    if k > MAX_SINGLE_PASS:
        return None
    return norm_tiles(k, MAX_SINGLE_PASS)[3]


def config_after_rms_norm(n: int, k: int, element_size: int, num_sms: int, *, silu: bool = False) -> GemvConfig:
    """Tiles of a GEMV whose x is an RMSNorm's output (qkv, gate_up), fused with that norm or not.

    A sum's bits depend on the thread layout the compiler gives the summed tile, and that depends on
    the warp count: one launch of norm + GEMV has one, so the norm's sum of squares and the GEMV's
    column sums are the separate kernels' sums only if both run at the norm kernel's warp count.
    The GEMV after the norm runs at it unfused too, so fusing changes no bit. Fused, tiles of several K
    steps run persistent (``NORM_GEMV_PROGRAMS_PER_SM``), which the plain GEMV ignores.

    All of K in one step where a tile of 4 columns holds it (``choose_config``): on an H200 Qwen3-8B's qkv
    (K=4096) so took a decode step from 4.599 to 4.447 ms, one TP=2 rank's share from 3.023 to 2.893
    (``decode-tiles-per-shape-*`` logs). Else, from ``LARGE_K`` on (8B-class models), a tile is 8 columns
    and 64 W values a thread; ``silu`` (the ``[gate; up]`` weights of a GEMV followed by SiLU-and-mul, whose
    fused program loads a gate tile and an up tile each K step) halves its K, so the fused program holds 64
    values a thread too: Qwen3-8B's gate_up took 4.627 ms a step so, 5.157 in tiles of 4 columns by 2048
    (``norm-gemv-tiles-8-warps`` logs).
    """
    warps = rms_norm_warps(k)  # None: a two-pass norm, never fused
    config = choose_config(n, k, element_size, num_sms, num_warps=warps)
    if warps is not None and k >= LARGE_K and (silu or config.block_k < k):
        config = _large_k_config(n, k, warps, num_sms, silu)
    fused_steps = warps is not None and config.block_k < k
    return replace(config, programs_per_sm=NORM_GEMV_PROGRAMS_PER_SM) if fused_steps else config


def _large_k_config(n: int, k: int, num_warps: int, num_sms: int, silu: bool) -> GemvConfig:
    """8 columns (4 where 8 leave fewer than two programs an SM), 64 W values a thread per K step, no stages."""
    block_n = 8 if triton.cdiv(n, 8) >= PROGRAMS_PER_SM * num_sms else 4
    block_k = min(num_warps * 32 * VALUES_PER_THREAD // block_n // (2 if silu else 1), triton.next_power_of_2(k))
    while block_k > 256 and k % block_k:
        block_k //= 2
    return GemvConfig(block_n, block_k, num_warps=num_warps, num_stages=1)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def _checked_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x as ``[rows, K]`` with contiguous K, after checking that x, W and bias fit the kernel."""
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


def _launch(rows, weight, bias, out, cfg: GemvConfig, push: PushTarget | None,
            summed: torch.Tensor | None = None) -> None:
    num_rows, k = rows.shape
    n = weight.shape[0]
    pdl = use_pdl(rows)
    unused = weight  # any tensor: the push arguments are not read without PUSH_RANKS, nor the sum's without ADD
    num_blocks = triton.cdiv(n, cfg.block_n)
    add_block = adding_block(num_rows * n, rows.is_cuda)
    add_programs = triton.cdiv(num_rows * n, add_block) if summed is not None else 0
    if add_programs > num_blocks:  # only tiles of over 128 columns: no config of choose_config's
        raise ValueError(f"{num_blocks} programs of {cfg.block_n} columns cannot add {num_rows} rows: narrow the tiles")
    _gemv_kernel[(num_blocks,)](
        rows, weight, bias if bias is not None else weight, out, num_rows, n, k, rows.stride(0), weight.stride(0), n,
        push.dest_ptrs if push else unused, push.slots if push else unused, push.slots[0].numel() if push else 0,
        summed if summed is not None else unused, push.abort if push else unused,
        BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None, NUM_STAGES=cfg.num_stages, SINGLE_STEP=cfg.block_k >= k,
        PREFETCH_LINES=prefetch_lines(cfg, k, rows.element_size(), pdl), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, USE_PDL=pdl, launch_pdl=pdl, ADD_PROGRAMS=add_programs, ADD_BLOCK=add_block,
        PUSH_RANKS=push.world_size if push else 0, PUSH_VALUES_PER_WORD=values_per_word(push.dtype) if push else 1,
    )


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         config: GemvConfig | None = None, after_rms_norm: bool = False, before_silu: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for at most ``MAX_ROWS`` rows of x; a new tensor ``[..., N]``.

    ``after_rms_norm``: x is an RMSNorm's output, and the tiles are :func:`config_after_rms_norm`'s
    (``before_silu``: for ``[gate; up]`` weights whose output goes to SiLU-and-mul, its ``silu`` tiles).
    """
    rows = _checked_rows(x, weight, bias)
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
    _launch(rows, weight, bias, out, cfg, None)
    return out


def gemv_push(x: torch.Tensor, weight: torch.Tensor, target: PushTarget, *, config: GemvConfig | None = None,
              add: bool = False) -> torch.Tensor | None:
    """``x @ W^T`` (this rank's partial sums of a row-parallel layer) pushed into ``target``'s slots on every rank.

    Tiles as :func:`gemv`'s, so the partial sums are the bits the plain GEMV would all-reduce. Without ``add``
    nothing is returned: the sum is read from ``target`` (``layers/partial_sums.py``); with it, the launch's
    last programs wait for every rank's push and return the sum, ``[rows, N]`` (mode ``gemv``).
    """
    rows = _checked_rows(x, weight, None)
    num_rows, k = rows.shape
    n = weight.shape[0]
    if target.dtype != x.dtype or target.n != n or not 0 < num_rows <= target.max_rows:
        raise ValueError(f"push target of {target.max_rows} rows of {target.n} {target.dtype} cannot take "
                         f"{num_rows} rows of {n} {x.dtype} partial sums")
    if k == 0:
        raise ValueError("gemv_push needs K >= 1")
    cfg = config or choose_config(n, k, x.element_size(), num_sms(x.device))
    per_word = checked_values_per_word(target)
    if cfg.block_n % per_word:
        raise ValueError(f"{per_word} {x.dtype} values a word: the tiles must be {per_word} columns wide or more, "
                         f"not {cfg.block_n}")
    summed = torch.empty((num_rows, n), dtype=x.dtype, device=x.device) if add else None
    _launch(rows, weight, None, target.slots[target.rank], cfg, target, summed)
    return summed
