"""Which tiles a decode GEMV of one shape runs (``fused/gemv.py``, ``fused/norm_gemv.py``): from (N, K) alone.

No autotuning (it would run inside CUDA-graph capture): the same choice eagerly and under capture. The
figure that matters is W bytes in flight per SM; ``python -m benchmarks.gemv --sweep`` times the alternatives.
``fused/gemv.py`` re-exports these names, where the launchers and plugins have always found them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from infer_core.layers.fused.rms_norm import LARGE_ROW_WARPS, MAX_SINGLE_PASS
from infer_core.layers.fused.rms_norm import _tiles as norm_tiles

LARGE_K = 4096  # from this K on, the large-K tiles of choose_config
# There: 8 columns by 1024 at 8 warps, faster in whole decode steps than the 16-warp tiles of 8 by 2048 that a
# standalone sweep chose (benchmarks/results: decode-tiles-per-shape-*, decode-plain-gemv-large-k-8-warps-*).
LARGE_K_TILE = 8192  # elements of W a program loads per K step there (16 KiB of bf16)
LARGE_K_WARPS = 8
# After a norm, tiles of several K steps run persistent at 2 programs an SM: faster than a program a block and
# than 1, 3 or 4 programs an SM or blocks handed out by an atomic counter (benchmarks.gemv --step;
# benchmarks/results: decode-persistent-norm-gemv-*).
NORM_GEMV_PROGRAMS_PER_SM = 2
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
    # several K steps: the first ones' W asked of L2 before the PDL wait (0: none). Off at large K, where it
    # measured slower (benchmarks.gemv --step); 1 below it (choose_config)
    prefetch_steps: int = 0
    # fused/norm_gemv.py only, for tiles of several K steps: > 0, a persistent launch of that many programs an
    # SM, each walking column blocks, so the norm's prologue runs once a program rather than once a block. No bit
    # changes: each block's sums are the same code on the same tiles. See NORM_GEMV_PROGRAMS_PER_SM.
    programs_per_sm: int = 0


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
    ``LARGE_K`` on, 8 columns by 1024 at 8 warps (``LARGE_K_TILE``; 4 by 4096 at K=4096 where 8 give too
    few programs). The row count does not change the choice. ``python -m benchmarks.gemv --sweep`` times
    the alternatives.

    ``num_warps`` pins the warp count (a GEMV after an RMSNorm runs at the norm's: see
    :func:`config_after_rms_norm`); the tile is then 64 values a thread at that count, at any K.
    """
    enough_programs = [b for b in (16, 8, 4) if triton.cdiv(n, b) >= PROGRAMS_PER_SM * num_sms]
    block_n = enough_programs[0] if enough_programs else 4
    whole_k = triton.next_power_of_2(k)
    if k >= LARGE_K and num_warps is None:  # K of 4096 and more (8B-class models): see LARGE_K_TILE
        block_n = 8 if 8 in enough_programs else 4
        if block_n == 4 and k == LARGE_K:
            # too few programs for 8 columns (an MoE model's o_proj, 2048 x 4096): 4 take all of K in one step, 64
            # values a thread as below LARGE_K, loaded before the PDL wait; 7.94 against 8.62 us for two steps of
            # 4 x 2048 at one row (benchmarks/results: decode-graph-kernels-h100-*, d5)
            return GemvConfig(4, k, num_warps=LARGE_K_WARPS, num_stages=1)
        block_k = min(LARGE_K_TILE // block_n, whole_k)
        while block_k > 256 and k % block_k:
            block_k //= 2
        return GemvConfig(block_n, block_k, num_warps=LARGE_K_WARPS, num_stages=1)
    tile = num_warps * 32 * VALUES_PER_THREAD if num_warps is not None else TILE_BYTES // element_size
    # all of K in one step where a tile of 4 columns or more holds it (a plain GEMV's K a power of two: no masked
    # lanes): the tile loads before the PDL wait, while the kernel before drains (and before a fused norm's
    # prologue); faster in decode steps than two steps of wider tiles (benchmarks/results: decode-tiles-per-shape-*)
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
    # below the large-K tiles, a program of several K steps asks L2 for its first one before the PDL wait, which
    # measured faster than none or all of them (benchmarks.graph_kernels); at large K it lost (GemvConfig)
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

    All of K in one step where a tile of 4 columns holds it (``choose_config``; ``decode-tiles-per-shape-*``
    logs). Else, from ``LARGE_K`` on (8B-class models), a tile is 8 columns and 64 W values a thread. ``silu``
    (the ``[gate; up]`` weights of a GEMV followed by SiLU-and-mul, whose fused program loads a gate tile and
    an up tile each K step) takes those tiles wherever the norm runs at ``LARGE_ROW_WARPS`` (rows from
    ``rms_norm.LARGE_ROW`` wide, rounded up to a power of two) with K halved, so the fused program holds 64 values
    a thread too, which measured faster than tiles of 4 columns by 2048
    (``norm-gemv-tiles-8-warps`` logs).
    """
    warps = rms_norm_warps(k)  # None: a two-pass norm, never fused
    config = choose_config(n, k, element_size, num_sms, num_warps=warps)
    if warps is not None and (k >= LARGE_K and config.block_k < k or silu and warps == LARGE_ROW_WARPS):
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
