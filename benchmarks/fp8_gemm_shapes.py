"""Qwen3-8B's projections at offline decode batch sizes: bf16 ``mm`` against FP8 ``torch._scaled_mm`` with row-wise
scales (what ``infer_quant_w8a8`` runs: a scale per token and per weight row) and with one scale per tensor.

Each GEMM alone, CUDA-graph replays, L2 flushed, median of 50; ``tflops`` from 2MNK. The FP8 operands are made
once (the activation quantization is not timed: ``benchmarks.quant_decode`` and the offline runs time it).

    python -m benchmarks.fp8_gemm_shapes --rows 64 128 256 512 --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.timing import graph_ms
from benchmarks.common import versions, write_result

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}  # (N, K)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[64, 128, 256, 512])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
        w8 = w.float().clamp(-448, 448).to(torch.float8_e4m3fn)
        w_scale_rows = torch.ones(1, n, device="cuda")
        one = torch.ones((), device="cuda")
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            x8 = x.float().clamp(-448, 448).to(torch.float8_e4m3fn)
            x_scale_rows = torch.ones(m, 1, device="cuda")
            systems = {
                "bf16 mm": lambda: x @ w.t(),
                "fp8 rowwise": lambda: torch._scaled_mm(x8, w8.t(), scale_a=x_scale_rows, scale_b=w_scale_rows,
                                                        out_dtype=torch.bfloat16),
                "fp8 tensorwise": lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                           out_dtype=torch.bfloat16),
            }
            line = []
            for system, fn in systems.items():
                t_us = 1e3 * graph_ms(fn)
                results.append({"shape": name, "n": n, "k": k, "rows": m, "system": system, "time_us": round(t_us, 2),
                                "tflops": round(2 * m * n * k / (t_us * 1e-6) / 1e12, 1)})
                line.append(f"{system} {t_us:7.1f} us ({results[-1]['tflops']:6.1f} TF/s)")
            print(f"{name:<8} M={m:<4} | " + " | ".join(line), flush=True)
    if args.out is not None:
        print(write_result("fp8-gemm-shapes", {"timing": "CUDA-graph replay, L2 flushed, median of 50",
                                               **versions()}, results, args.out))


if __name__ == "__main__":
    main()
