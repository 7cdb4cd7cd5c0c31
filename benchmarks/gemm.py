"""Projections at decode batches of 3-256 rows: our split-K Triton GEMM against F.linear (cuBLAS), on one GPU.

Shapes: Qwen3-0.6B's and Qwen3-8B's qkv, o, gate_up, down and LM head (from ``benchmarks/configs``),
bfloat16, at 3, 4, 8, 16, 32, 64, 128, 192 and 256 rows. Both systems are timed whatever the engine
dispatches. Figures per cell (``benchmarks/gemv.py``'s ``Cell``): ``time_us`` is one call as a decode
step's CUDA graph runs it (a graph of C calls on C copies of W holding >= 64 MiB, L2 flushed before
each replay, median of 50, / C); ``eager_us`` plain calls; ``gb_s`` the bytes that must move over
``time_us``; ``tflops``; ``max_ulps`` from the float32 result rounded to bfloat16; ``deterministic``:
two calls give equal bits. ``floor`` rows: the larger of bytes over the measured copy bandwidth and
FLOPs over the measured cuBLAS matmul rate (an 8192^3 bf16 GEMM).

``--sweep`` also times a grid of tiles and splits per cell (compiled first on ``--jobs`` processes for
an sm_90 target, so the timing loop finds Triton's cache warm) and prints, per shape, the best config
per row count and at the end a ``TUNED`` table for ``infer_core/layers/fused/gemm_splitk.py``. The
last lines propose the rows where the kernel (tuned, with --sweep) beats cuBLAS, per shape.

    python -m benchmarks.gemm --out DIR [--models Qwen3-0.6B] [--rows 4 256] [--sweep] [--jobs 16]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from benchmarks.attention import bench_ms, copy_bandwidth
from benchmarks.common import versions, write_result
from benchmarks.gemv import Cell, projections
from infer_core.layers import fused
from infer_core.layers.fused.gemm_splitk import GemmConfig, choose_config, gemm_splitk, normalized_splits

MODELS = ("Qwen3-0.6B", "Qwen3-8B")
ROWS = (3, 4, 8, 16, 32, 64, 128, 192, 256)
SMEM_BYTES = 200 << 10  # operand stages that fit an H100 SM's shared memory with room to spare
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_WAVES = 4
GB, TERA = 1e9, 1e12


def sweep_configs(m: int, n: int, k: int, num_sms: int) -> list[GemmConfig]:
    """W @ x^T tiles up to 64 rows, x @ W^T from 32; 64/128 W rows; split counts up to MAX_WAVES waves."""
    tiles = []
    if m <= 64:
        tiles += [(max(16, triton.next_power_of_2(m)), bn, bk, True) for bn in (64, 128) for bk in (128, 256)]
    if m >= 32:
        block_ms = (64,) if m <= 64 else (64, 128)
        tiles += [(bm, bn, bk, False) for bm in block_ms for bn in (64, 128) for bk in (64, 128)]
    found = set()
    for bm, bn, bk, swap in tiles:
        warps = 8 if bm * bn >= 128 * 128 else 4
        num_tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        for stages in (3, 4):
            if (bm + bn) * bk * 2 * stages > SMEM_BYTES:
                continue
            for split in SPLITS:
                split, _ = normalized_splits(k, bk, split)
                if split == 1 or num_tiles * split <= MAX_WAVES * num_sms:
                    found.add(GemmConfig(bm, bn, bk, split, swap, warps, stages))
    return sorted(found, key=lambda c: (not c.swap_ab, c.block_m, c.block_n, c.block_k, c.split_k, c.num_stages))


def _compile_worker(target: tuple[int, int], pdl: bool, tasks: list[tuple[int, int, int, GemmConfig]]) -> int:
    """Compile (not run) the kernel for ``tasks`` on CPU tensors, for a CUDA target: fills Triton's cache."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from infer_core.layers.fused import gemm_splitk as module

    class Target:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", target[0], target[1])

    driver.set_active(Target())
    module.use_pdl = lambda x: pdl  # as on the GPU
    kernel, run = module._gemm_splitk_kernel, module._gemm_splitk_kernel.run
    kernel.run = lambda *args, grid, warmup, **kwargs: run(*args, grid=grid, warmup=True, **kwargs)
    weights: dict[tuple[int, int], torch.Tensor] = {}
    for m, n, k, cfg in tasks:
        w = weights.setdefault((n, k), torch.empty(n, k, dtype=torch.bfloat16))  # never touched: no memory
        gemm_splitk(torch.empty(m, k, dtype=torch.bfloat16), w, None, config=cfg)
    return len(tasks)


def precompile(tasks: list[tuple[int, int, int, GemmConfig]], jobs: int) -> None:
    """Compile every config of the sweep on ``jobs`` processes (one compile per distinct specialisation)."""
    start = time.perf_counter()
    distinct = {}
    for m, n, k, cfg in tasks:  # M is not specialised; N, K only by divisibility by 16
        distinct.setdefault((n % 16 == 0, k % 16 == 0, k % cfg.block_k == 0, cfg), (m, n, k, cfg))
    chunks = [list(distinct.values())[i::jobs] for i in range(jobs)]
    major, minor = torch.cuda.get_device_capability()
    env_interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            done = pool.starmap(_compile_worker, [((major * 10 + minor, 32), fused.PDL, c) for c in chunks if c])
    finally:
        if env_interpret is not None:
            os.environ["TRITON_INTERPRET"] = env_interpret
    print(f"compiled {sum(done)} kernel variants on {jobs} processes in {time.perf_counter() - start:.0f} s",
          flush=True)


def matmul_rate() -> float:
    """FLOP/s of cuBLAS on an 8192^3 bfloat16 GEMM: the ceiling the floor's math time is taken at."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / (bench_ms(lambda: a @ a) * 1e-3)


def measure(cell: Cell, op, copy_bw: float, flops: float, with_eager: bool = True) -> dict:
    row = cell.measure(op, copy_bw, with_eager)
    row["tflops"] = round(flops / (row["time_us"] * 1e-6) / TERA, 1)
    row["deterministic"] = torch.equal(op(cell.x, cell.weights[0], cell.bias), op(cell.x, cell.weights[0], cell.bias))
    return row


def tuned_table(best: dict[tuple[int, int], list[tuple[int, GemmConfig]]]) -> str:
    """``TUNED`` for gemm_splitk.py: per (N, K), runs of measured row counts with one best config merged.

    Only row counts a decode CUDA graph is captured at (1, 2, 4, then multiples of 8) bound an entry,
    so an unpadded batch and its padded graph fall in one entry and take the same tiles (the same bits).
    """
    lines = ["TUNED: dict[tuple[int, int], tuple[tuple[int, GemmConfig], ...]] = {"]
    for (n, k), per_m in sorted(best.items()):
        merged: list[tuple[int, GemmConfig]] = []
        for m, cfg in sorted((p for p in per_m if p[0] in (1, 2, 4) or p[0] % 8 == 0), key=lambda p: p[0]):
            if merged and merged[-1][1] == cfg:
                merged[-1] = (m, cfg)
            else:
                merged.append((m, cfg))
        lines.append(f"    ({n}, {k}): (")
        lines += [f"        ({m}, GemmConfig({c.block_m}, {c.block_n}, {c.block_k}, {c.split_k}, {c.swap_ab}, "
                  f"{c.num_warps}, {c.num_stages}))," for m, c in merged]
        lines.append("    ),")
    return "\n".join(lines + ["}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder of the results JSON (default: results/)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tiles and splits per cell")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes compiling the sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gemm needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_bw, mm_rate = copy_bandwidth(), matmul_rate()
    projs = [p for model in args.models for p in projections(model)]
    if args.sweep:
        precompile([(m, p.n, p.k, cfg) for p in projs for m in args.rows
                    for cfg in sweep_configs(m, p.n, p.k, num_sms)], args.jobs)
    print(f"copy bandwidth {copy_bw / GB:.0f} GB/s, cuBLAS 8192^3 {mm_rate / TERA:.0f} TFLOP/s, {num_sms} SMs, "
          f"PDL {'on' if fused.PDL else 'off'}; per-call times from CUDA-graph replays of back-to-back calls on "
          "distinct W copies, L2 flushed")
    header = (f"{'model':<11} {'proj':<8} {'N':>6} {'K':>5} {'M':>3} | {'cuBLAS us':>9} {'TF/s':>4} | "
              f"{'split-K us':>10} {'TF/s':>4} {'GB/s':>5} | {'speedup':>7} {'floor us':>8} | config")
    print(f"{header}\n{'-' * len(header)}")
    results, totals, best, faster = [], {}, {}, {}
    for proj in projs:
        for m in args.rows:
            cell = Cell(proj, m)
            flops = 2 * m * proj.n * proj.k
            cfg = choose_config(m, proj.n, proj.k, 2, num_sms)
            base = {"model": proj.model, "projection": proj.name, "n": proj.n, "k": proj.k, "num_rows": m,
                    "bytes": cell.num_bytes, "flops": flops, "copies": cell.copies}
            cublas = {"system": "f-linear", **measure(cell, F.linear, copy_bw, flops)}
            ours = {"system": "triton-splitk", "config": asdict(cfg), **measure(cell, gemm_splitk, copy_bw, flops)}
            floor_us = max(cell.num_bytes / copy_bw, flops / mm_rate) * 1e6
            floor = {"system": "floor", "time_us": round(floor_us, 2)}
            results += [{**base, **cublas}, {**base, **ours}, {**base, **floor}]
            ours_us = ours["time_us"]
            print(f"{proj.model:<11} {proj.name:<8} {proj.n:>6} {proj.k:>5} {m:>3} | {cublas['time_us']:>9.2f} "
                  f"{cublas['tflops']:>4.0f} | {ours_us:>10.2f} {ours['tflops']:>4.0f} {ours['gb_s']:>5.0f} | "
                  f"{cublas['time_us'] / ours_us:>6.2f}x {floor_us:>8.2f} | {cfg}", flush=True)
            if args.sweep:
                timed = []
                for c in sweep_configs(m, proj.n, proj.k, num_sms):
                    try:
                        row = measure(cell, lambda x, w, b, c=c: gemm_splitk(x, w, b, config=c), copy_bw, flops,
                                      with_eager=False)
                    except Exception as exc:  # past the SM's shared memory or registers: listed, not timed
                        results.append({**base, "system": "triton-sweep", "config": asdict(c),
                                        "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                        continue
                    results.append({**base, "system": "triton-sweep", "config": asdict(c), **row})
                    if row["max_ulps"] <= 1 and row["deterministic"]:
                        timed.append((row["time_us"], c))
                if timed:
                    ours_us, top = min(timed, key=lambda t: t[0])
                    best.setdefault((proj.n, proj.k), []).append((m, top))
                    print(f"{'':<32} sweep: best {ours_us:.2f} us ({cublas['time_us'] / ours_us:.2f}x cuBLAS) "
                          f"{top} of {len(timed)}", flush=True)
            if ours_us < 0.97 * cublas["time_us"]:
                faster.setdefault((proj.model, proj.name, proj.n, proj.k), []).append(m)
            for system, t in (("f-linear", cublas["time_us"]), ("triton-splitk", ours_us), ("floor", floor_us)):
                totals[(proj.model, m, system)] = totals.get((proj.model, m, system), 0.0) + t * proj.per_step
            del cell
        torch.cuda.empty_cache()
    print("\none decode step's projections (layers x 4 + LM head), us" + (" (split-K at its best tiles)"
                                                                         if args.sweep else ""))
    for model in args.models:
        for m in args.rows:
            f_lin, ours, floor = (totals[(model, m, s)] for s in ("f-linear", "triton-splitk", "floor"))
            print(f"  {model:<11} M={m:>3}: cuBLAS {f_lin:8.1f}  split-K {ours:8.1f}  floor {floor:8.1f}  "
                  f"({f_lin / ours:.2f}x)")
            results.append({"model": model, "projection": "decode-step", "num_rows": m, "system": "sum",
                            "f_linear_us": round(f_lin, 1), "triton_splitk_us": round(ours, 1),
                            "floor_us": round(floor, 1)})
    print("\nrows where split-K is >= 3% faster than cuBLAS (dispatch candidates):")
    for (model, name, n, k), ms in faster.items():
        print(f"  {model:<11} {name:<8} [{n}, {k}]: M in {ms}")
    if best:
        print("\n# paste into infer_core/layers/fused/gemm_splitk.py:\n" + tuned_table(best))
    settings = {"dtype": "bfloat16", "rows": args.rows, "models": args.models, "num_sms": num_sms,
                "copy_bandwidth_gb_s": round(copy_bw / GB, 1), "matmul_tflops": round(mm_rate / TERA, 1),
                "pdl": fused.PDL, "sweep": args.sweep,
                "timing": "time_us: CUDA-graph replay of C back-to-back calls on C distinct W copies (>= 64 MiB), "
                          "L2 flushed before each replay, median of 50, / C; eager_us: do_bench median of plain "
                          "calls", "versions": versions("triton")}
    print(f"wrote {write_result('gemm', settings, results, args.out)}")


if __name__ == "__main__":
    main()
