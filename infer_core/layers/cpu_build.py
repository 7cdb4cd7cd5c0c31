"""The CPU's C kernels: each source compiled once per machine by the system's C compiler, loaded with ctypes.

A kernel library is built by ``cc`` (or ``$CC``) for this CPU's vector units (``-march=native``) with OpenMP, into
the user's cache directory (``$XDG_CACHE_HOME/infer/kernels``, else ``~/.cache/infer/kernels``), named by a hash
of the source, the flags, the compiler and the CPU's features, so a shared cache never hands one machine another's
build; later starts load it without compiling. Its ``#pragma omp`` loops run on torch's OpenMP threads: the
library links ``libgomp.so.1``, which the process has already loaded with torch, so there is one thread pool and
``torch.set_num_threads`` sizes it. Where no compiler is found or the build fails, :func:`compiled` returns None
(logged once, with the reason) and the layers keep their torch code.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno")

# ctypes argument kinds of the kernels' signatures
PTR, LONG, INT, FLOAT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float

# bfloat16 <-> float32 and the identity for float32, for kernels written once over a LOAD/STORE pair
CONVERSIONS = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

/* memcpy and selects, not unions and branches: loops over them vectorize */
static inline float from_bf16(uint16_t x) {
    const uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t to_bf16(float f) {  /* round to nearest even, as torch does; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : rounded;
}

static inline float from_f32(float x) { return x; }
static inline float to_f32(float x) { return x; }
"""

# The same conversions 16 lanes at a time on AVX-512 (with BW and VL: 16-bit lanes, masked 256-bit loads), for
# kernels that gcc's vectorizer turns into slow code around the 16-bit stores: ``VEC_LOAD_*`` / ``VEC_STORE_*``
# take a mask of the lanes in bounds (``vec_mask``), ``VEC_ROUND_*`` is ``LOAD(STORE(v))``, all bit for bit the
# scalar conversions. ``VECTORS`` is defined where they are; a kernel keeps its scalar loop for other CPUs, and
# defining ``INFER_SCALAR_ONLY`` (the tests) compiles only that.
VECTORS = r"""
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(INFER_SCALAR_ONLY)
#define VECTORS 1
#include <immintrin.h>

static inline __mmask16 vec_mask(int left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u); }

static inline __m512 VEC_LOAD_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void VEC_STORE_f32(float *p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
static inline __m512 VEC_ROUND_f32(__m512 v) { return v; }

/* to_bf16 on each lane: the rounded bits in the low half of each 32-bit lane */
static inline __m512i vec_bf16_bits(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_srli_epi32(_mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000))), 16);
}

/* to_bf16 on each lane, packed: AVX512_BF16's conversion rounds to nearest even and quiets NaN as to_bf16 does,
   but flushes subnormals to zero; lanes holding one (rare) take the integer rounding */
static inline __m256i vec_to_bf16(__m512 v) {
#ifdef __AVX512BF16__
    const __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
    const __mmask16 subnormal = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)),
                                                        _mm512_set1_epi32(0x7fffff));
    if (__builtin_expect(subnormal == 0, 1)) return (__m256i)_mm512_cvtneps_pbh(v);
#endif
    return _mm512_cvtepi32_epi16(vec_bf16_bits(v));
}

static inline __m512 VEC_LOAD_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
static inline void VEC_STORE_bf16(uint16_t *p, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, vec_to_bf16(v));
}
static inline __m512 VEC_ROUND_bf16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(vec_to_bf16(v)), 16));
}
#endif
"""


def scalar_source(source: str) -> str:
    """``source`` compiled without its ``VECTORS`` paths: the scalar loops, as on a CPU without AVX-512."""
    return "#define INFER_SCALAR_ONLY 1\n" + source


def _cpu_features() -> str:
    """This CPU's feature flags: what ``-march=native`` compiles for."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """This CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read): what kernels may assume."""
    line = _cpu_features()
    return set(line.split(":", 1)[1].split()) if line.startswith("flags") else set()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "infer" / "kernels"


def _build(compiler: str, source: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        c_file, built = Path(scratch) / f"{target.stem}.c", Path(scratch) / target.name
        c_file.write_text(source)
        result = subprocess.run([compiler, *FLAGS, str(c_file), "-o", str(built), "-lm"], capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: another process never loads a half-written library


@functools.cache
def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def compiled(name: str, source: str, signatures: tuple[tuple[str, tuple], ...]) -> ctypes.CDLL | None:
    """The library ``name`` built from ``source`` (compiled on first use), its functions typed by ``signatures``
    ((function, argtypes) pairs, each returning void); None where it cannot be built here."""
    compiler = _compiler()
    if compiler is None:
        logger.info("CPU kernels (%s): no C compiler (cc, gcc or $CC) found; the torch code runs instead (install "
                    "gcc for the faster CPU path)", name)
        return None
    key = hashlib.sha256("\n".join((source, " ".join(FLAGS), compiler, _cpu_features())).encode()).hexdigest()
    target = cache_root() / f"{name}-{key[:16]}.so"
    try:
        if not target.is_file():
            _build(compiler, source, target)
        library = ctypes.CDLL(str(target))
        for function, argtypes in signatures:
            getattr(library, function).argtypes = list(argtypes)
            getattr(library, function).restype = None
    except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as e:
        logger.warning("CPU kernels (%s): building or loading them failed (%s); the torch code runs instead",
                       name, e)
        return None
    return library


def pack_weight(function, weight: torch.Tensor, pair_n: int) -> torch.Tensor:
    """A GEMM kernel's packing of ``weight`` [N, K]: ``function(w, out, N, K)`` writes it into a flat tensor of the
    weight's dtype, rows padded to a multiple of ``pair_n``."""
    n, k = weight.shape
    weight = weight.detach().contiguous()
    out = torch.empty(-(-n // pair_n) * pair_n * k, dtype=weight.dtype)
    function(weight.data_ptr(), out.data_ptr(), n, k)
    return out


def run_linear(function, x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [M, K] times a packed weight's transpose, plus ``bias`` [N] (or None): ``function(x, x's row stride,
    packed, bias or NULL, y, M, N, K)`` writes y [M, N] in x's dtype; x's rows contiguous."""
    m, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(m, n, dtype=x.dtype)
    if bias is not None:
        bias = bias.contiguous()
    function(x.data_ptr(), x.stride(0), packed.data_ptr(), bias.data_ptr() if bias is not None else None,
             y.data_ptr(), m, n, k)
    return y
