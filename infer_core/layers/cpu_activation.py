"""The CPU's SiLU-and-mul in one pass: ``silu(gate) * up`` over the gate_up projection's ``[R, 2I]`` output.

torch runs it as two ops over the two strided halves (silu writes an ``[R, I]`` tensor that mul reads again):
about a fifth of a bfloat16 prefill step of the default model at 2,048 tokens. Here each row is read once and
written once, on torch's OpenMP threads. The exponential is computed inline so the loop vectorizes (a call to
``expf`` does not): ``e^x = 2^n * e^r`` with ``n = round(x / ln 2)``, ``r`` reduced in two steps
(Cody-Waite) and ``e^r`` a degree-6 polynomial, within 2 float32 ulps of the exact value. The rounding
follows torch's ops: ``silu(gate)`` is rounded to the model's dtype, then the product is. On AVX-512 the row is
written with intrinsics, 16 lanes a step (``cpu_build.VECTORS``: gcc's own vectorization of the bfloat16
conversions spends more instructions than the exponential), the same arithmetic. Compiled once per
machine (``cpu_build.py``); where it cannot be, :func:`load` returns None and the layer runs its torch code.
"""

from __future__ import annotations

import ctypes

import torch

from infer_core.layers.cpu_build import CONVERSIONS, INT, LONG, PTR, VECTORS, compiled, scalar_source

_SOURCE = CONVERSIONS + VECTORS + r"""
static inline float exp_inline(float x) {
    /* below -87.3 e^x is subnormal, and 1 + it is 1 either way; past ln(FLT_MAX) = 88.7228 the product below
       overflows to inf, as e^x does */
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.8f ? 88.8f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* rounded: 1.5 * 2^23 */
    float r = x - n * 0.693145751953125f;  /* ln 2's high bits: n * it is exact */
    r = r - n * 1.42860682030941723212e-6f;  /* ln 2's low part */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float top = n > 127.5f ? 2.0f : 1.0f;  /* 2^128 is past float32: 2^127 * 2 */
    const int32_t bits = ((int32_t)(n - (top - 1.0f)) + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale * top;
}

#ifdef VECTORS
/* exp_inline on 16 lanes, the same steps (max and min return their second operand where one is NaN) */
static inline __m512 vec_exp(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
    const __m512 shift = _mm512_set1_ps(12582912.0f), one = _mm512_set1_ps(1.0f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift), shift);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, one);
    p = _mm512_fmadd_ps(p, r, one);
    return _mm512_scalef_ps(p, n);  /* p * 2^n rounded once: p * scale * top's value, overflow to inf alike */
}

#define SILU_ROW(S, LOAD, STORE)                                                                            \
    for (int e = 0; e < I; e += 16) {                                                                        \
        const __mmask16 m = vec_mask(I - e);                                                                 \
        const __m512 g = VEC_LOAD_##S(gate + e, m);                                                          \
        const __m512 minus_g = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g),                  \
                                                                    _mm512_set1_epi32(0x80000000)));        \
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), vec_exp(minus_g)));            \
        VEC_STORE_##S(o + e, _mm512_mul_ps(VEC_ROUND_##S(s), VEC_LOAD_##S(up + e, m)), m);                   \
    }
#else
#define SILU_ROW(S, LOAD, STORE)                                                                            \
    _Pragma("omp simd")                                                                                      \
    for (int e = 0; e < I; e++) {                                                                            \
        const float g = LOAD(gate[e]);                                                                       \
        o[e] = STORE(LOAD(STORE(g / (1.0f + exp_inline(-g)))) * LOAD(up[e]));                                \
    }
#endif

/* out [R, I] contiguous = silu(x[:, :I]) * x[:, I:], x [R, 2I] with a row stride. */
#define SILU_AND_MUL(NAME, S, T, LOAD, STORE)                                                                \
void NAME(const T *x, long x_stride, T *out, int R, int I) {                                                \
    _Pragma("omp parallel for schedule(static) if ((long)R * I >= 32768)")                                   \
    for (int r = 0; r < R; r++) {                                                                            \
        const T *gate = x + (long)r * x_stride, *up = gate + I;                                              \
        T *o = out + (long)r * I;                                                                            \
        SILU_ROW(S, LOAD, STORE)                                                                             \
    }                                                                                                        \
}

SILU_AND_MUL(silu_and_mul_f32, f32, float, from_f32, to_f32)
SILU_AND_MUL(silu_and_mul_bf16, bf16, uint16_t, from_bf16, to_bf16)
"""

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_SIGNATURE = (PTR, LONG, PTR, INT, INT)
DTYPES = tuple(_SUFFIX)


def load(scalar_only: bool = False) -> ctypes.CDLL | None:
    """The compiled kernel (built on first use), or None where it cannot be built here; ``scalar_only``: the loop
    other CPUs than AVX-512 ones run (the tests compare the two)."""
    source = scalar_source(_SOURCE) if scalar_only else _SOURCE
    return compiled("activation", source, tuple((f"silu_and_mul_{s}", _SIGNATURE) for s in _SUFFIX.values()))


def takes(x: torch.Tensor) -> bool:
    """Whether the kernel takes ``x``: a 2-D CPU tensor in float32 or bfloat16 with contiguous rows."""
    return x.device.type == "cpu" and x.dtype in _SUFFIX and x.dim() == 2 and x.stride(-1) == 1


def silu_and_mul(library: ctypes.CDLL, x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x`` [R, 2I]."""
    rows, width = x.shape
    out = torch.empty(rows, width // 2, dtype=x.dtype)
    getattr(library, f"silu_and_mul_{_SUFFIX[x.dtype]}")(x.data_ptr(), x.stride(0), out.data_ptr(), rows, width // 2)
    return out
