"""Decode attention over the paged KV cache on the CPU: one C kernel that reads each row's keys and values through
its block table, with no gather into a dense copy.

The torch path copies every decode row's blocks into a new tensor each step (``index_select``), then SDPA reads
that copy again (and repeats the KV heads for GQA): several passes over the whole context per layer, which grow
with it. This kernel reads each key and value once, where it lies in the cache, on torch's OpenMP threads (it
is built against the same runtime, which the process has loaded with torch): for each row (each (row, KV head)
in a batch too small to give every thread rows) it stores the step's new key and value, scores the row's keys for
its query heads, takes the softmax in float32 and sums the values, streaming the row's blocks in order.

The source is compiled once per machine (``cpu_build.py``); where it cannot be, :func:`load` returns None and the
torch backend gathers the context for SDPA as before.
"""

from __future__ import annotations

import ctypes

import torch

from infer_core.layers.cpu_build import CONVERSIONS, FLOAT, INT, LONG, PTR, compiled

_SOURCE = CONVERSIONS + r"""
#include <string.h>

/* e^x for x <= 0 (inputs below -87 give e^-87): x = k ln2 + r, |r| <= ln2 / 2, e^r by its degree-6 Taylor
   polynomial (relative error under 2e-7), times 2^k from the exponent bits. Unlike libm's expf it vectorizes. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float k = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-06f;
    const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    union { uint32_t u; float f; } two_k;
    two_k.u = (uint32_t)((int32_t)k + 127) << 23;
    return p * two_k.f;
}

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  /* v16 at any float's address */
typedef int32_t i16 __attribute__((vector_size(64)));
typedef uint16_t u16 __attribute__((vector_size(32)));

/* a + b's lanes pairwise: lanes 0-7 the pair sums of a, lanes 8-15 those of b */
static inline v16 fold(v16 a, v16 b) {
#if defined(__clang__)
    return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
    const i16 even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const i16 odd = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    return __builtin_shuffle(a, b, even) + __builtin_shuffle(a, b, odd);
#endif
}

/* lane j: the sum of v[j]'s 16 lanes (four rounds of pairwise folds) */
static inline v16 sums16(const v16 *v) {
    v16 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++) a[k] = fold(v[2 * k], v[2 * k + 1]);
    for (int k = 0; k < 4; k++) b[k] = fold(a[2 * k], a[2 * k + 1]);
    for (int k = 0; k < 2; k++) c[k] = fold(b[2 * k], b[2 * k + 1]);
    return fold(c[0], c[1]);
}

/* 16 elements at p (float32, or bfloat16 where bf16, widened) */
static inline v16 load16(const char *p, int bf16) {
    if (bf16) {
        u16 narrow;
        memcpy(&narrow, p, sizeof(narrow));
        return (v16)(__builtin_convertvector(narrow, i16) << 16);
    }
    v16 wide;
    memcpy(&wide, p, sizeof(wide));
    return wide;
}

/* One work item: row r's query heads of KV heads [h0, h0 + nkv) against its keys [start, len), block by block
   (key t is at slot table[t / bs] * bs + t % bs), into out's rows, for head_dim D a multiple of 16. Scores of
   16 keys at a time: each key's 16-lane partial products, then their lane sums together (sums16), no reduction
   per key. Inlined with D a constant where the caller knows it. */
static inline __attribute__((always_inline)) void attend(
        const char *q, char *kc, char *vc, const int32_t *table, int start, int len, int h0, int nkv, int g, int hk,
        const int D, int bs, float scale, float *s, long max_keys, char *out, int esize, int bf16) {
    const int nh = nkv * g, c16 = D / 16;
    const long row_bytes = (long)hk * D * esize;
    v16 qv[nh * c16], acc[nh * c16], kv[c16];
    float inv[nh];
    for (int e = 0; e < nh * c16; e++) { qv[e] = load16(q + (long)e * 16 * esize, bf16) * scale; acc[e] = (v16){0}; }
    for (int b = start / bs; b * bs < len; b++) {
        const int t0 = b * bs > start ? b * bs : start, t1 = (b + 1) * bs < len ? (b + 1) * bs : len;
        const char *kp = kc + ((long)table[b] * bs + t0 - b * bs) * row_bytes + (long)h0 * D * esize;
        if ((b + 1) * bs < len)
            for (long line = 0; line < bs * row_bytes; line += 64) __builtin_prefetch(kc + table[b + 1] * bs * row_bytes + line);
        for (int c0 = t0; c0 < t1; c0 += 16, kp += 16 * row_bytes) {
            const int n = t1 - c0 < 16 ? t1 - c0 : 16;
            v16 partial[nh][16];
            for (int j = 0; j < 16; j++)
                for (int hh = 0; hh < nkv; hh++) {
                    for (int c = 0; c < c16; c++)
                        kv[c] = j < n ? load16(kp + j * row_bytes + ((long)hh * D + c * 16) * esize, bf16) : (v16){0};
                    for (int i = hh * g; i < (hh + 1) * g; i++) {
                        v16 sum = qv[i * c16] * kv[0];
                        for (int c = 1; c < c16; c++) sum += qv[i * c16 + c] * kv[c];
                        partial[i][j] = sum;
                    }
                }
            for (int i = 0; i < nh; i++) {
                const v16 sums = sums16(partial[i]);
                memcpy(s + (long)i * max_keys + c0 - start, &sums, (size_t)n * sizeof(float));
            }
        }
    }
    for (int i = 0; i < nh; i++) {
        float *si = s + (long)i * max_keys, m = -INFINITY, total = 0.0f;
        _Pragma("omp simd reduction(max:m)")
        for (int t = 0; t < len - start; t++) m = si[t] > m ? si[t] : m;
        _Pragma("omp simd reduction(+:total)")
        for (int t = 0; t < len - start; t++) { si[t] = exp_nonpositive(si[t] - m); total += si[t]; }
        inv[i] = total > 0.0f ? 1.0f / total : 0.0f;
    }
    for (int b = start / bs; b * bs < len; b++) {
        const int t0 = b * bs > start ? b * bs : start, t1 = (b + 1) * bs < len ? (b + 1) * bs : len;
        const char *vp = vc + ((long)table[b] * bs + t0 - b * bs) * row_bytes + (long)h0 * D * esize;
        if ((b + 1) * bs < len)
            for (long line = 0; line < bs * row_bytes; line += 64) __builtin_prefetch(vc + table[b + 1] * bs * row_bytes + line);
        for (int t = t0; t < t1; t++, vp += row_bytes)
            for (int hh = 0; hh < nkv; hh++) {
                for (int c = 0; c < c16; c++) kv[c] = load16(vp + ((long)hh * D + c * 16) * esize, bf16);
                for (int i = hh * g; i < (hh + 1) * g; i++) {
                    const float p = s[(long)i * max_keys + t - start];
                    for (int c = 0; c < c16; c++) acc[i * c16 + c] += p * kv[c];
                }
            }
    }
    for (int i = 0; i < nh; i++)
        for (int d = 0; d < D; d++) {
            const float x = acc[i * c16 + d / 16][d % 16] * inv[i];
            if (bf16) ((uint16_t *)out)[i * D + d] = to_bf16(x); else ((float *)out)[i * D + d] = x;
        }
}

/* q [R, H, D] (row stride q_stride elements, heads contiguous); caches [blocks, bs, hk, D]; block tables
   [R, bt_stride]; out [R, H, D] contiguous; scratch [R * H, max_keys] float32; elements float32, or bfloat16
   where bf16. Work items are (row, group of KV heads), `groups` groups per row (1: a row's key and value rows are
   read whole and in order; hk: a KV head each, for batches too small to give every thread rows). Where k_new is
   not NULL, an item first stores its heads of the row's new key and value (k_new, v_new [R, hk, D], row strides
   k_stride, v_stride) at slots[r]. Keys [start, seq_len) are attended: start = seq_len - window where a window is
   set (window 0: none). */
void decode_attention(const void *q, long q_stride, void *kc, void *vc, const int32_t *bt, long bt_stride,
                      const int32_t *seq_lens, const void *k_new, const void *v_new, long k_stride, long v_stride,
                      const int64_t *slots, void *out, float *scratch, long max_keys, int R, int H, int hk, int D,
                      int bs, float scale, int window, int groups, int bf16) {
    const int g = H / hk, nkv = hk / groups, esize = bf16 ? 2 : 4;
    _Pragma("omp parallel for schedule(static)")
    for (int item = 0; item < R * groups; item++) {
        const int r = item / groups, h0 = item % groups * nkv, len = seq_lens[r];
        const int start = (window > 0 && len > window) ? len - window : 0;
        if (k_new) {
            const long at = (slots[r] * hk + h0) * (long)D * esize;
            memcpy((char *)kc + at, (const char *)k_new + (r * k_stride + (long)h0 * D) * esize, (size_t)nkv * D * esize);
            memcpy((char *)vc + at, (const char *)v_new + (r * v_stride + (long)h0 * D) * esize, (size_t)nkv * D * esize);
        }
        const char *qr = (const char *)q + (r * q_stride + (long)h0 * g * D) * esize;
        char *o = (char *)out + ((long)r * H + (long)h0 * g) * D * esize;
        float *s = scratch + ((long)r * H + (long)h0 * g) * max_keys;
        const int32_t *table = bt + r * bt_stride;
        if (D == 64)
            attend(qr, kc, vc, table, start, len, h0, nkv, g, hk, 64, bs, scale, s, max_keys, o, esize, bf16);
        else if (D == 128)
            attend(qr, kc, vc, table, start, len, h0, nkv, g, hk, 128, bs, scale, s, max_keys, o, esize, bf16);
        else
            attend(qr, kc, vc, table, start, len, h0, nkv, g, hk, D, bs, scale, s, max_keys, o, esize, bf16);
    }
}
"""

_SIGNATURE = (PTR, LONG, PTR, PTR, PTR, LONG, PTR, PTR, PTR, LONG, LONG, PTR, PTR, PTR, LONG, INT, INT, INT, INT, INT,
              FLOAT, INT, INT, INT)
DTYPES = (torch.float32, torch.bfloat16)


def load() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use), or None where it cannot be built here."""
    return compiled("decode_attention", _SOURCE, (("decode_attention", _SIGNATURE),))


def supports(q_dtype: torch.dtype, kv_cache: torch.Tensor, head_dim: int) -> bool:
    """Whether the kernel reads this cache for queries of ``q_dtype`` (the model's dtype, no FP8 cache): head_dim a
    multiple of 16 (the kernel's vectors) up to 512."""
    return (kv_cache.device.type == "cpu" and kv_cache.dtype == q_dtype and q_dtype in DTYPES
            and head_dim % 16 == 0 and head_dim <= 512)


def decode_attention(library: ctypes.CDLL, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, max_keys: int, scale: float, window: int | None,
                     new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attention of each row's one query ``q`` [R, H, D] over its keys ``[0, seq_lens[r])`` (the last ``window``
    of them where set) in the paged ``kv_cache`` [2, blocks, block_size, kv_heads, D]; ``block_tables`` int32
    [R, >= blocks a row uses], ``seq_lens`` int32 [R], ``max_keys`` >= every seq_len. ``new_kv`` (k, v
    [R, kv_heads, D], int64 slots [R]): the rows' new keys and values, stored at their slots before they are read
    (None: already in the cache). Returns [R, H, D]."""
    rows, heads, head_dim = q.shape
    _, _, block_size, kv_heads, _ = kv_cache.shape
    if q.stride(2) != 1 or q.stride(1) != head_dim or not kv_cache.is_contiguous():
        raise ValueError(f"decode_attention needs q's heads contiguous (strides {q.stride()}) and a contiguous cache")
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32 or block_tables.stride(1) != 1:
        raise ValueError("decode_attention needs int32 block tables (rows contiguous) and int32 seq_lens")
    seq_lens = seq_lens.contiguous()
    k_ptr = v_ptr = slots_ptr = k_stride = v_stride = 0
    if new_kv is not None:
        k, v, slots = new_kv
        for name, x in (("k", k), ("v", v)):
            if x.shape != (rows, kv_heads, head_dim) or x.stride(2) != 1 or x.stride(1) != head_dim:
                raise ValueError(f"decode_attention needs the new {name} [{rows}, {kv_heads}, {head_dim}] with its "
                                 f"heads contiguous, got shape {tuple(x.shape)}, strides {x.stride()}")
        slots = slots.contiguous()
        k_ptr, v_ptr, slots_ptr, k_stride, v_stride = k.data_ptr(), v.data_ptr(), slots.data_ptr(), k.stride(0), v.stride(0)
    out = torch.empty(rows, heads, head_dim, dtype=q.dtype)
    keys = max(1, min(max_keys, window) if window else max_keys)
    scratch = torch.empty(rows * heads * keys, dtype=torch.float32)
    # a batch too small to give every thread rows is split by KV head too
    groups = kv_heads if rows < 2 * torch.get_num_threads() else 1
    library.decode_attention(
        q.data_ptr(), q.stride(0), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), k_ptr, v_ptr, k_stride, v_stride, slots_ptr, out.data_ptr(),
        scratch.data_ptr(), keys, rows, heads, kv_heads, head_dim, block_size, scale, window or 0, groups,
        int(q.dtype == torch.bfloat16))
    return out
