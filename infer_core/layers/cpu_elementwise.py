"""The CPU's fused elementwise kernels: the residual add with RMSNorm, and rotary on q and k in place.

On the CPU at decode sizes an op costs more in dispatch than in arithmetic: the torch RMSNorm is nine ops (add,
float, pow, mean, add, rsqrt, mul, cast, mul) and the rotary about a dozen, per layer. Each of these kernels is one
call doing the same arithmetic: the norm in float32 (the sum of squares in another order than torch's mean, so
within an ulp of it), its output rounded to the model's dtype before the weight multiplies it and the residual
sum rounded as torch rounds them; the rotary in float32 with cos and sin rounded to the model's dtype first, each
product rounded as torch's ops round them. On AVX-512 both loops are written with intrinsics, 16 lanes a step
(``cpu_build.VECTORS``), the same roundings. Compiled once per machine (``cpu_build.py``); where they cannot be,
:func:`load` returns None and the layers run their torch code.
"""

from __future__ import annotations

import ctypes

import torch

from infer_core.layers.cpu_build import CONVERSIONS, FLOAT, INT, LONG, PTR, VECTORS, compiled, scalar_source

_SOURCE = CONVERSIONS + VECTORS + r"""
#ifdef VECTORS
/* a row's residual sum (stored) and its float32 values (row), the sum of squares; then the weighted norm */
#define NORM_SUM(S, T, LOAD, STORE)                                                                            \
    __m512 squares = _mm512_setzero_ps();                                                                    \
    for (int e = 0; e < N; e += 16) {                                                                        \
        const __mmask16 m = vec_mask(N - e);                                                                 \
        __m512 v = VEC_LOAD_##S(xr + e, m);                                                                  \
        if (residual) {                                                                                      \
            v = VEC_ROUND_##S(_mm512_add_ps(v, VEC_LOAD_##S(residual + r * r_stride + e, m)));               \
            VEC_STORE_##S(residual_out + (long)r * N + e, v, m);                                             \
        }                                                                                                    \
        _mm512_mask_storeu_ps(row + e, m, v);                                                                \
        squares = _mm512_fmadd_ps(v, v, squares);                                                            \
    }                                                                                                        \
    total = _mm512_reduce_add_ps(squares);
#define NORM_OUT(S, LOAD, STORE)                                                                            \
    const __m512 scale = _mm512_set1_ps(inv);                                                                \
    for (int e = 0; e < N; e += 16) {                                                                        \
        const __mmask16 m = vec_mask(N - e);                                                                 \
        const __m512 normed = VEC_ROUND_##S(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + e), scale));        \
        VEC_STORE_##S(o + e, _mm512_mul_ps(VEC_LOAD_##S(w + e, m), normed), m);                              \
    }
#else
#define NORM_SUM(S, T, LOAD, STORE)                                                                            \
    if (residual) {                                                                                          \
        const T *rr = residual + r * r_stride;                                                               \
        T *sum = residual_out + (long)r * N;                                                                 \
        for (int e = 0; e < N; e++) { sum[e] = STORE(LOAD(xr[e]) + LOAD(rr[e])); row[e] = LOAD(sum[e]); }   \
    } else {                                                                                                 \
        for (int e = 0; e < N; e++) row[e] = LOAD(xr[e]);                                                    \
    }                                                                                                        \
    _Pragma("omp simd reduction(+:total)")                                                                   \
    for (int e = 0; e < N; e++) total += row[e] * row[e];
#define NORM_OUT(S, LOAD, STORE)                                                                            \
    for (int e = 0; e < N; e++) o[e] = STORE(LOAD(w[e]) * LOAD(STORE(row[e] * inv)));
#endif

/* out = norm(x + residual) * w, residual_out = x + residual (residual NULL: norm(x) * w, nothing stored);
   x, residual [R, N] with row strides; out, residual_out [R, N] contiguous. */
#define ADD_RMS_NORM(NAME, S, T, LOAD, STORE)                                                                \
void NAME(const T *x, long x_stride, const T *residual, long r_stride, const T *w, T *out, T *residual_out,  \
          int R, int N, float eps) {                                                                         \
    _Pragma("omp parallel for schedule(static) if (R * N >= 32768)")                                         \
    for (int r = 0; r < R; r++) {                                                                            \
        float row[N], total = 0.0f;                                                                          \
        const T *xr = x + r * x_stride;                                                                      \
        NORM_SUM(S, T, LOAD, STORE)                                                                             \
        const float inv = 1.0f / sqrtf(total / N + eps);                                                     \
        T *o = out + (long)r * N;                                                                            \
        NORM_OUT(S, LOAD, STORE)                                                                             \
    }                                                                                                        \
}

#ifdef VECTORS
/* one head's rotation: 16 pairs a step, cos and sin rounded to the model's dtype as torch's cache is */
#define ROTATE(S, LOAD, STORE)                                                                              \
    for (int i = 0; i < half; i += 16) {                                                                     \
        const __mmask16 m = vec_mask(half - i);                                                              \
        const __m512 cos_i = VEC_ROUND_##S(_mm512_maskz_loadu_ps(m, c + i));                                 \
        const __m512 sin_i = VEC_ROUND_##S(_mm512_maskz_loadu_ps(m, s + i));                                 \
        const __m512 x1 = VEC_LOAD_##S(x + i, m), x2 = VEC_LOAD_##S(x + i + half, m);                        \
        const __m512 a = VEC_ROUND_##S(_mm512_mul_ps(x1, cos_i)), b = VEC_ROUND_##S(_mm512_mul_ps(x2, sin_i)); \
        const __m512 c2 = VEC_ROUND_##S(_mm512_mul_ps(x2, cos_i)), d = VEC_ROUND_##S(_mm512_mul_ps(x1, sin_i)); \
        VEC_STORE_##S(x + i, _mm512_sub_ps(a, b), m);                                                        \
        VEC_STORE_##S(x + i + half, _mm512_add_ps(c2, d), m);                                                \
    }
#else
#define ROTATE(S, LOAD, STORE)                                                                              \
    for (int i = 0; i < half; i++) {                                                                         \
        const float cos_i = LOAD(STORE(c[i])), sin_i = LOAD(STORE(s[i]));                                    \
        const float x1 = LOAD(x[i]), x2 = LOAD(x[i + half]);                                                 \
        const float a = LOAD(STORE(x1 * cos_i)), b = LOAD(STORE(x2 * sin_i));                                \
        const float c2 = LOAD(STORE(x2 * cos_i)), d = LOAD(STORE(x1 * sin_i));                               \
        x[i] = STORE(a - b);                                                                                 \
        x[i + half] = STORE(c2 + d);                                                                         \
    }
#endif

/* q [T, hq, D], k [T, hk, D] (row strides, heads contiguous) rotated in place by positions [T] (int32): the
   first rot_dim of each head in the neox layout, cos_sin [positions, rot_dim] float32 (cos, then sin). */
#define ROTARY(NAME, S, T, LOAD, STORE)                                                                      \
void NAME(const int32_t *positions, T *q, long q_stride, int hq, T *k, long k_stride, int hk, int D,         \
          const float *cos_sin, int rot_dim, int tokens) {                                                   \
    const int half = rot_dim / 2;                                                                            \
    _Pragma("omp parallel for schedule(static) if (tokens * (hq + hk) * rot_dim >= 32768)")                  \
    for (int t = 0; t < tokens; t++) {                                                                       \
        const float *c = cos_sin + (long)positions[t] * rot_dim, *s = c + half;                              \
        for (int head = 0; head < hq + hk; head++) {                                                         \
            T *x = head < hq ? q + t * q_stride + (long)head * D : k + t * k_stride + (long)(head - hq) * D; \
            ROTATE(S, LOAD, STORE)                                                                           \
        }                                                                                                    \
    }                                                                                                        \
}

ADD_RMS_NORM(add_rms_norm_f32, f32, float, from_f32, to_f32)
ADD_RMS_NORM(add_rms_norm_bf16, bf16, uint16_t, from_bf16, to_bf16)
ROTARY(rotary_f32, f32, float, from_f32, to_f32)
ROTARY(rotary_bf16, bf16, uint16_t, from_bf16, to_bf16)
"""

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_NORM = (PTR, LONG, PTR, LONG, PTR, PTR, PTR, INT, INT, FLOAT)
_ROTARY = (PTR, PTR, LONG, INT, PTR, LONG, INT, INT, PTR, INT, INT)
DTYPES = tuple(_SUFFIX)


def load(scalar_only: bool = False) -> ctypes.CDLL | None:
    """The compiled kernels (built on first use), or None where they cannot be built here; ``scalar_only``: the
    loops other CPUs than AVX-512 ones run (the tests compare the two)."""
    signatures = tuple((f"add_rms_norm_{s}", _NORM) for s in _SUFFIX.values())
    signatures += tuple((f"rotary_{s}", _ROTARY) for s in _SUFFIX.values())
    return compiled("elementwise", scalar_source(_SOURCE) if scalar_only else _SOURCE, signatures)


def takes(x: torch.Tensor) -> bool:
    """Whether the kernels take ``x``: a CPU tensor in float32 or bfloat16 whose last dimension is contiguous."""
    return x.device.type == "cpu" and x.dtype in _SUFFIX and x.stride(-1) == 1


def add_rms_norm(library: ctypes.CDLL, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float):
    """``norm(x) * weight`` (residual None), else ``(norm(x + residual) * weight, x + residual)``; x [R, N]."""
    rows, n = x.shape
    out = torch.empty(rows, n, dtype=x.dtype)
    summed = torch.empty(rows, n, dtype=x.dtype) if residual is not None else None
    getattr(library, f"add_rms_norm_{_SUFFIX[x.dtype]}")(
        x.data_ptr(), x.stride(0), 0 if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0), weight.data_ptr(), out.data_ptr(),
        0 if summed is None else summed.data_ptr(), rows, n, eps)
    return out if residual is None else (out, summed)


def rotary_inplace(library: ctypes.CDLL, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                   cos_sin: torch.Tensor, rot_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D] and k [T, Hk, D] (heads contiguous) rotated in place by int32 ``positions`` [T]."""
    tokens, heads, head_dim = q.shape
    getattr(library, f"rotary_{_SUFFIX[q.dtype]}")(
        positions.data_ptr(), q.data_ptr(), q.stride(0), heads, k.data_ptr(), k.stride(0), k.shape[1], head_dim,
        cos_sin.data_ptr(), rot_dim, tokens)
    return q, k
