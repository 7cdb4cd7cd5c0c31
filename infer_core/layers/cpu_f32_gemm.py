"""float32 ``x @ W^T (+ b)`` on the CPU's AVX-512 units for decode-sized batches, the weight packed once after the load.

At the rows a CPU decodes (1-64) oneDNN's packed float32 GEMM leaves much of the cores' FMA rate unused on the
default model's projections. Here a thread takes 32 output columns at a time (the weight packed so their K
steps are 128 contiguous bytes: ``[ceil(N/32)][K][32]``, zeros past row N) and up to 12 rows of ``x`` against
them: 24 accumulator registers, each K step one load of the 32 weights and 24 FMAs with ``x``'s value broadcast,
the weights prefetched 16 steps ahead and re-read from L2 for the next 12 rows. Each output is one float32 sum
over K in order (then the bias), so it differs from oneDNN's blocked sums by float32 rounding only
(``benchmarks/results/cpu-amx-gemm-2026-11-28/``). Compiled once per machine (``cpu_build.py``) where the CPU has
AVX-512F; elsewhere :func:`load` returns None and oneDNN runs.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from infer_core.layers.cpu_build import LONG, PTR, compiled, cpu_flags, pack_weight, run_linear

PAIR_N = 32  # output columns a thread takes at a time

_SOURCE = r"""
#include <immintrin.h>


/* w [n, k] -> [ceil(n/32)][k][32], zeros past row n */
#define PREFETCH_FLOATS 512  /* 16 steps of K ahead */

void f32_pack(const float *w, float *out, long n, long k) {
    const long pairs = (n + 31) / 32;
    #pragma omp parallel for schedule(static)
    for (long p = 0; p < pairs; p++)
        for (long j = 0; j < 32; j++) {
            const long row = p * 32 + j;
            for (long i = 0; i < k; i++)
                out[(p * k + i) * 32 + j] = row < n ? w[row * k + i] : 0.0f;
        }
}

/* rows R (<= 12) of y, columns col..col+31 (masked past n): 2R accumulators, a K step's 32 weights loaded once */
static inline __attribute__((always_inline)) void block(const float *x, long xs, const float *w, long k, float *y,
                                                        long ys, long col, long n, const float *bias, const int R) {
    __m512 acc[12][2];
    #pragma GCC unroll 12
    for (int r = 0; r < R; r++) { acc[r][0] = _mm512_setzero_ps(); acc[r][1] = _mm512_setzero_ps(); }
    for (long i = 0; i < k; i++) {
        const __m512 w0 = _mm512_loadu_ps(w + i * 32), w1 = _mm512_loadu_ps(w + i * 32 + 16);
        _mm_prefetch((const char *)(w + i * 32 + PREFETCH_FLOATS), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + i * 32 + PREFETCH_FLOATS + 16), _MM_HINT_T0);
        #pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(x[r * xs + i]);
            acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);
        }
    }
    const long width = n - col < 32 ? n - col : 32;
    const __mmask16 m0 = width >= 16 ? 0xffff : (__mmask16)((1u << width) - 1u);
    const __mmask16 m1 = width >= 32 ? 0xffff : width > 16 ? (__mmask16)((1u << (width - 16)) - 1u) : 0;
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (bias) { b0 = _mm512_maskz_loadu_ps(m0, bias + col); b1 = _mm512_maskz_loadu_ps(m1, bias + col + 16); }
    #pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(y + r * ys + col, m0, _mm512_add_ps(acc[r][0], b0));
        _mm512_mask_storeu_ps(y + r * ys + col + 16, m1, _mm512_add_ps(acc[r][1], b1));
    }
}

/* y [m, n] = x [m, k] (row stride xs) @ w^T + bias (or NULL), w packed by f32_pack */
void f32_linear(const float *x, long xs, const float *packed, const float *bias, float *y, long m, long n, long k) {
    const long pairs = (n + 31) / 32;
    #pragma omp parallel for schedule(static) if (pairs > 1)
    for (long p = 0; p < pairs; p++) {
        const float *w = packed + p * k * 32;
        for (long r0 = 0; r0 < m; r0 += 12) {
            const long rows = m - r0 < 12 ? m - r0 : 12;
            const float *xr = x + r0 * xs;
            float *yr = y + r0 * n;
            switch (rows) {
#define CASE(R) case R: block(xr, xs, w, k, yr, n, p * 32, n, bias, R); break;
                CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
            }
        }
    }
}
"""

_SIGNATURES = (
    ("f32_pack", (PTR, PTR, LONG, LONG)),
    ("f32_linear", (PTR, LONG, PTR, PTR, PTR, LONG, LONG, LONG)),
)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The kernels (built on first use), or None where the CPU lacks AVX-512F or they cannot be built."""
    if "avx512f" not in cpu_flags():
        return None
    return compiled("f32_gemm", _SOURCE, _SIGNATURES)


def takes(weight: torch.Tensor) -> bool:
    """Whether a weight [N, K] runs here: float32 on the CPU, and the kernels available."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and load() is not None)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] in the kernel's order (the module's layout), a flat float32 tensor."""
    return pack_weight(load().f32_pack, weight, PAIR_N)


def linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [M, K] (float32, contiguous rows) times the packed weight's transpose, plus ``bias`` [N]: [M, N]."""
    return run_linear(load().f32_linear, x, packed, n, bias)
