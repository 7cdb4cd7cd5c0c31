"""bfloat16 ``x @ W^T (+ b)`` on the CPU's AMX tiles, with the weight packed into tile order once after the load.

Where the CPU has AMX (``amx_tile`` and ``amx_bf16``), a bfloat16 GEMM is one ``TDPBF16PS`` per 16 x 16 output
tile and 32 inputs: a 1 KB tile of the weight, read once from memory, meets up to 32 rows of the activations. At
the batch sizes a CPU decodes (1-32 rows) the GEMMs are then bound by reading the weights, which oneDNN's packed
GEMM does not reach there (``benchmarks/results/cpu-amx-gemm-2026-11-28/``).

Layout (:func:`pack`): the weight's rows in pairs of 16-row blocks (the output columns; a last odd block is paired
with zeros), and within a pair, for each 32-wide step of K, the two blocks' tiles one after the other, each tile
16 rows of K pairs x 16 columns x 2 (AMX's "VNNI" order: the two bfloat16 of a K pair side by side). One OpenMP
thread takes whole pairs and streams their tiles in order; the activations' tiles come from the rows of ``x``
(16 rows of 32 values a load, any row stride), 32 rows at a time against a pair's tiles (in L2 after the first),
over blocks of 256 rows (in L2 while the pairs go by; a 2,048-row prefill reads the weights 8 times). Sums in
float32 per tile, the bias added, then each output rounded once to bfloat16, to nearest even as torch
rounds (subnormal inputs and outputs count as zero, as the tile unit and the conversion instruction treat them).

Linux hands a process the AMX state only when asked (``arch_prctl(ARCH_REQ_XCOMP_PERM)``): :func:`load` asks once
and returns None where the CPU lacks AMX, the kernel cannot be built, or the system refuses.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from infer_core.layers.cpu_build import LONG, PTR, compiled, cpu_flags, pack_weight, run_linear

logger = logging.getLogger(__name__)

TILE_N = 16  # output columns in a tile
TILE_K = 32  # bfloat16 inputs a tile row spans (64 bytes)
PAIR_N = 2 * TILE_N

_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE 512  /* bfloat16 values in a 16 x 64-byte tile */
#define PREFETCH_BYTES 8192
#ifndef ROWS_PER_BLOCK
#define ROWS_PER_BLOCK 256
#endif

int amx_request(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

/* w [n, k] -> packed [ceil(n/32)][k/32][2][16 K pairs][16 columns][2], zeros past row n */
void amx_pack_bf16(const uint16_t *w, uint16_t *out, long n, long k) {
    const long pairs = (n + 31) / 32, steps = k / 32;
    #pragma omp parallel for schedule(static)
    for (long p = 0; p < pairs; p++)
        for (long s = 0; s < steps; s++)
            for (int half = 0; half < 2; half++) {
                uint16_t *tile = out + ((p * steps + s) * 2 + half) * TILE;
                for (int kp = 0; kp < 16; kp++)
                    for (int j = 0; j < 16; j++)
                        for (int e = 0; e < 2; e++) {
                            const long row = p * 32 + half * 16 + j;
                            tile[(kp * 16 + j) * 2 + e] = row < n ? w[row * k + s * 32 + 2 * kp + e] : 0;
                        }
            }
}

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tiles 0-3: sums (row halves 0/1 of column blocks 0/1); 4, 5: x's row halves; 6, 7: the weight's blocks */
static void configure(int rows0, int rows1) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    const int rows[8] = {rows0, rows1, rows0, rows1, rows0, rows1, 16, 16};
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = (uint8_t)rows[t];
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* one tile row of sums (+ bias) rounded to bfloat16 (nearest even) into y's columns col..col+15 below n */
static void store(const float *sums, int rows, uint16_t *y, long y_stride, long col, long n, const uint16_t *bias) {
    const long width = n - col < 16 ? n - col : 16;
    if (width <= 0)
        return;
    const __mmask16 mask = (__mmask16)((1u << width) - 1u);
    __m512 add = _mm512_setzero_ps();
    if (bias)
        add = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + col)), 16));
    for (int i = 0; i < rows; i++) {
        const __m512 row = _mm512_add_ps(_mm512_loadu_ps(sums + i * 16), add);
        _mm256_mask_storeu_epi16(y + i * y_stride + col, mask, (__m256i)_mm512_cvtneps_pbh(row));
    }
}

/* y [m, n] = x [m, k] (row stride x_stride) @ w^T + bias (or NULL), w packed by amx_pack_bf16; k % 32 == 0 */
void amx_linear_bf16(const uint16_t *x, long x_stride, const uint16_t *packed, const uint16_t *bias, uint16_t *y,
                     long m, long n, long k) {
    const long pairs = (n + 31) / 32, steps = k / 32;
    /* past one 32-row chunk, each block of x is copied into tile order first (contiguous 1 KB tile loads) */
    uint16_t *packed_x = m > 32 ? aligned_alloc(64, (size_t)ROWS_PER_BLOCK * k * 2) : NULL;
    #pragma omp parallel if (pairs > 1)
    {
        float sums[16 * 16];
        int rows0 = 0, rows1 = 0;
        for (long block = 0; block < m; block += ROWS_PER_BLOCK) {  /* x's block stays in L2 across the pairs */
            const long block_end = block + ROWS_PER_BLOCK < m ? block + ROWS_PER_BLOCK : m;
            if (packed_x) {
                #pragma omp for schedule(static)
                for (long r = block; r < block_end; r++) {
                    const long c = (r - block) / 32, h = (r - block) % 32 / 16, i = (r - block) % 16;
                    for (long s = 0; s < steps; s++)
                        memcpy(packed_x + ((c * steps + s) * 2 + h) * TILE + i * 32, x + r * x_stride + s * 32, 64);
                }
            }
            #pragma omp for schedule(static)
            for (long p = 0; p < pairs; p++) {
                const uint16_t *w = packed + p * steps * 2 * TILE;
                for (long m0 = block; m0 < block_end; m0 += 32) {
                    const int rows = block_end - m0 < 32 ? (int)(block_end - m0) : 32;
                    const int r0 = rows < 16 ? rows : 16, r1 = rows > 16 ? rows - 16 : 1;
                    if (r0 != rows0 || r1 != rows1) {
                        configure(r0, r1);
                        rows0 = r0;
                        rows1 = r1;
                    }
                    /* x's tiles: straight from its rows, or from the block's copy in tile order */
                    const uint16_t *a = packed_x ? packed_x + (m0 - block) / 32 * steps * 2 * TILE : x + m0 * x_stride;
                    const long a_stride = packed_x ? 32 : x_stride, a_step = packed_x ? 2 * TILE : 32;
                    const long a_half = packed_x ? TILE : 16 * x_stride;
                    const int both = rows > 16;
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (long s = 0; s < steps; s++) {
                        const uint16_t *b = w + s * 2 * TILE;
                        if (m0 == block) {  /* the pair's tiles come from memory once a block */
                            const char *ahead = (const char *)b + PREFETCH_BYTES;
                            for (int line = 0; line < 2 * TILE * 2; line += 64)
                                _mm_prefetch(ahead + line, _MM_HINT_T0);
                        }
                        _tile_loadd(4, a + s * a_step, a_stride * 2);
                        _tile_loadd(6, b, 64);
                        _tile_loadd(7, b + TILE, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(2, 4, 7);
                        if (both) {
                            _tile_loadd(5, a + a_half + s * a_step, a_stride * 2);
                            _tile_dpbf16ps(1, 5, 6);
                            _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                    uint16_t *out = y + m0 * n;
                    _tile_stored(0, sums, 64);
                    store(sums, r0, out, n, p * 32, n, bias);
                    _tile_stored(2, sums, 64);
                    store(sums, r0, out, n, p * 32 + 16, n, bias);
                    if (both) {
                        _tile_stored(1, sums, 64);
                        store(sums, r1, out + 16 * n, n, p * 32, n, bias);
                        _tile_stored(3, sums, 64);
                        store(sums, r1, out + 16 * n, n, p * 32 + 16, n, bias);
                    }
                }
            }
        }
        if (rows0)
            _tile_release();
    }
    free(packed_x);
}
"""

_SIGNATURES = (
    ("amx_pack_bf16", (PTR, PTR, LONG, LONG)),
    ("amx_linear_bf16", (PTR, LONG, PTR, PTR, PTR, LONG, LONG, LONG)),
)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The AMX kernels (built on first use, the process granted the tile state), or None where they cannot run."""
    if not {"amx_tile", "amx_bf16"} <= cpu_flags():
        return None
    library = compiled("amx", _SOURCE, (*_SIGNATURES, ("amx_request", ())))
    if library is None:
        return None
    library.amx_request.restype = ctypes.c_int
    status = library.amx_request()
    if status != 0:
        logger.info("CPU kernels (amx): the kernel refused this process the AMX tile state (arch_prctl returned "
                    "%d); bfloat16 GEMMs stay on oneDNN", status)
        return None
    return library


def takes(weight: torch.Tensor) -> bool:
    """Whether a weight [N, K] runs here: bfloat16 on the CPU, K a multiple of 32, and the kernels available."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2
            and weight.shape[1] % TILE_K == 0 and load() is not None)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] in tile order (the module's layout), a flat bfloat16 tensor."""
    return pack_weight(load().amx_pack_bf16, weight, PAIR_N)


def linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [M, K] (bfloat16, contiguous rows) times the packed weight's transpose, plus ``bias`` [N]: [M, N]."""
    return run_linear(load().amx_linear_bf16, x, packed, n, bias)
