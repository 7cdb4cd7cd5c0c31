"""The ``floor`` row: the device's measured ceilings put into :mod:`infer_core.bench.roofline`.

Copy bandwidth is a large device-to-device copy, (bytes read + bytes written) / time, best of
several; the matmul rate is a square matmul in the benchmark's dtype, 2n^3 / time, best of
several. Both are what this device reaches from PyTorch, not its datasheet figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from infer_core.bench.roofline import Floor, ModelDims, latency_floor, throughput_floor

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(slots=True)
class Ceilings:
    bandwidth: float  # bytes/s, read + written
    matmul_rate: float  # FLOP/s
    copy_bytes: int
    matmul_n: int


def _best_seconds(fn, device: torch.device, repeats: int) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs after one warm-up (CUDA events on a GPU)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - began)
    return best


def _copy_seconds(num_bytes: int, device: torch.device, repeats: int) -> float:
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return _best_seconds(lambda: dst.copy_(src), device, repeats)


def _matmul_seconds(n: int, dtype: torch.dtype, device: torch.device, repeats: int) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty_like(a)
    return _best_seconds(lambda: torch.matmul(a, b, out=out), device, repeats)


def measure_ceilings(device: torch.device, dtype: str, copy_bytes: int | None = None, matmul_n: int | None = None,
                     repeats: int = 10) -> Ceilings:
    """Copy bandwidth and matmul rate of ``device`` (sizes default to ones that saturate it)."""
    is_cuda = device.type == "cuda"
    copy_bytes = copy_bytes or (2 << 30 if is_cuda else 256 << 20)
    matmul_n = matmul_n or (8192 if is_cuda else 1024)
    copy_s = _copy_seconds(copy_bytes, device, repeats)
    matmul_s = _matmul_seconds(matmul_n, DTYPES[dtype], device, repeats if is_cuda else 3)
    if is_cuda:
        torch.cuda.empty_cache()
    return Ceilings(2 * copy_bytes / copy_s, 2.0 * matmul_n**3 / matmul_s, copy_bytes, matmul_n)


def _common(ceilings: Ceilings, dims: ModelDims, floor: Floor) -> dict[str, Any]:
    return {
        "system": "floor",
        "copy_bandwidth_gb_s": round(ceilings.bandwidth / 1e9, 1),
        "matmul_tflop_s": round(ceilings.matmul_rate / 1e12, 1),
        "weight_bytes_per_step": dims.weight_bytes,
        "kv_bytes_per_token": dims.kv_bytes_per_token,
        "num_decode_steps": floor.num_decode_steps,
        "decode_bytes": floor.decode_bytes,
        "decode_s": round(floor.decode_s, 4),
        "prefill_flops": floor.prefill_flops,
        "prefill_s": round(floor.prefill_s, 4),
    }


def throughput_floor_row(ceilings: Ceilings, config: dict[str, Any], dtype: str, prompt_lens: list[int],
                         output_lens: list[int], max_num_seqs: int) -> dict[str, Any]:
    dims = ModelDims.from_config(config, dtype)
    floor = throughput_floor(dims, prompt_lens, output_lens, max_num_seqs, ceilings.bandwidth, ceilings.matmul_rate)
    return {
        **_common(ceilings, dims, floor),
        "output_tok_s": round(floor.output_tok_s, 1),
        "output_tokens": floor.output_tokens,
        "elapsed_s": round(floor.total_s, 3),
        "num_prompts": len(prompt_lens),
        "max_num_seqs": max_num_seqs,
    }


def latency_floor_row(ceilings: Ceilings, config: dict[str, Any], dtype: str, prompt_len: int,
                      new_tokens: int) -> dict[str, Any]:
    dims = ModelDims.from_config(config, dtype)
    floor = latency_floor(dims, prompt_len, new_tokens, ceilings.bandwidth, ceilings.matmul_rate)
    decode_ms = floor.decode_s / max(1, floor.num_decode_steps) * 1e3
    return {
        **_common(ceilings, dims, floor),
        "output_tok_s": round(floor.output_tok_s, 1),
        "ttft_ms": round(floor.prefill_s * 1e3, 3),
        "ms_per_token": round(decode_ms, 4),
        "decode_tok_s": round(1e3 / decode_ms, 1),
        "weights_only_ms_per_token": round(dims.weight_bytes / ceilings.bandwidth * 1e3, 4),
    }
