"""Projections at decode batch sizes: our Triton GEMV against F.linear (cuBLAS), on one GPU.

Every linear layer of Qwen3-0.6B, Qwen3-1.7B, Qwen3-8B and Llama-3.1-8B (qkv, o, gate_up, down, LM head; shapes
from ``benchmarks/configs``), and Qwen3-30B-A3B's attention projections and LM head (its experts:
``benchmarks.moe_kernel``), bfloat16, at 1, 2, 4 and 8 rows. Both systems are timed whatever
``infer_core.layers.fused.GEMV`` says. Figures per cell:

- ``time_us``: one call, as a decode step's CUDA graph runs it: a graph of C back-to-back calls on C
  distinct copies of W (C so that the copies hold >= 64 MiB; 1 for the big ones), L2 flushed before
  each replay, median of 50 replays, divided by C. So each call reads W from HBM and pays the gap
  between kernels of a graph, not the host's launch;
- ``eager_us``: ``triton.testing.do_bench`` median of plain calls (host launch and Python included);
- ``gb_s``: bytes that must move (W, x, y, bias once) over ``time_us``; ``copy_bw_share``: that over
  the device-to-device copy bandwidth measured in the same run (the ``floor`` rows: those bytes at
  that bandwidth);
- ``max_ulps``: largest distance from the float32 result rounded to bfloat16, in bfloat16 steps.

A per-model line sums one decode step's projections (layers x (qkv + o + gate_up + down) + LM head).
``--sweep`` also times a grid of tile choices per cell and prints the best next to the heuristic's,
to retune ``choose_config`` (slow: a compile per tile and row count; use ``--models``/``--rows``).
The engine runs the GEMV up to ``infer_core.layers.fused.dense.GEMV_MAX_ROWS`` rows (``gemv_max_rows`` in the
results' settings), F.linear beyond.

Kernels launch as the engine launches them: with programmatic dependent launch where ``use_pdl`` says so
(an H100: yes, unless ``--no-pdl``), so in a graph of back-to-back calls each may start while the one
before drains, and programs of several K steps then ask L2 for their first ``prefetch_steps`` K steps
of W first. Cells of one W copy (C=1) have no call before them in the graph: nothing to overlap there.
``--prefetch-steps S ...`` times the GEMV of such cells again at each S (0: no prefetch, the kernel before it).

``--step`` times one decode step's projections in one CUDA graph (``benchmarks/gemv_step.py``).

``--fused`` times instead the decoder layer's two chains at decode sizes, fused and not (``benchmarks/gemv_fused.py``).

    python -m benchmarks.gemv --out DIR [--models Qwen3-0.6B ...] [--rows 1 8] [--sweep]
    python -m benchmarks.gemv --fused [--models Qwen3-0.6B Qwen3-8B] [--rows 1 2] [--out DIR]
    python -m benchmarks.gemv --step [--models Qwen3-8B] [--rows 1 2] [--prefetch-steps 0 1 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from benchmarks.timing import bench_ms, copy_bandwidth, graph_ms
from benchmarks.common import versions, write_result
from benchmarks.fused_ops import max_ulps
from infer_core.layers import fused
from infer_core.layers.embedding import vocab_rows_per_rank
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.dense import GEMV_MAX_ROWS
from infer_core.layers.fused.gemv import GemvConfig, choose_config, gemv
from infer_core.models.config import load_model_config

CONFIGS = Path(__file__).parent / "configs"
MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-8B", "Llama-3.1-8B", "Qwen3-30B-A3B")
ROWS = (1, 2, 4, 8)
FUSED_MODELS = ("Qwen3-0.6B", "Qwen3-8B")
DTYPE = torch.bfloat16
COLD_BYTES = 64 << 20  # weight copies per graph: past the 50 MiB L2 of an H100
MAX_COPIES = 32
GB = 1e9
DEVICE = "cuda"


@dataclass(frozen=True, slots=True)
class Projection:
    model: str
    name: str
    n: int
    k: int
    has_bias: bool
    per_step: int  # calls in one decode step (layers, or 1 for the LM head)


def projections(model: str, tensor_parallel: int = 1) -> list[Projection]:
    """The model's projections as one rank of ``tensor_parallel`` holds them (the Megatron split of
    ``layers/linear.py``: qkv, gate_up and the LM head by output rows, o and down by input features).
    A mixture of experts has no dense gate_up and down (its experts: ``benchmarks.moe_kernel``)."""
    c = load_model_config(CONFIGS / model)
    tp = tensor_parallel
    q, kv = c.num_heads * c.head_dim // tp, max(1, c.num_kv_heads // tp) * c.head_dim
    L = c.num_layers
    mlp = [] if c.moe is not None else [
        Projection(model, "gate_up", 2 * c.intermediate_size // tp, c.hidden_size, c.mlp_bias, L),
        Projection(model, "down", c.hidden_size, c.intermediate_size // tp, c.mlp_bias, L)]
    return [Projection(model, "qkv", q + 2 * kv, c.hidden_size, c.qkv_bias, L),
            Projection(model, "o", c.hidden_size, q, c.o_bias, L), *mlp,
            Projection(model, "lm_head", vocab_rows_per_rank(c.vocab_size, tp), c.hidden_size, False, 1)]


def sweep_configs(n: int, k: int) -> list[GemvConfig]:
    """16/32 KiB tiles at 4..16 columns, 32 or 64 values a thread, 1 or 3 stages."""
    found = []
    for block_n in (4, 8, 16):
        for tile in (8192, 16384):
            block_k = min(tile // block_n, triton.next_power_of_2(k))
            while block_k > 256 and k % block_k:
                block_k //= 2
            for per_thread in (32, 64):
                warps = max(1, min(16, block_n * block_k // (32 * per_thread)))
                for stages in (1, 3) if block_k < k else (1,):
                    found.append(GemvConfig(block_n, block_k, warps, stages))
    return sorted(set(found), key=lambda c: (c.block_n, c.block_k, c.num_warps, c.num_stages))


class Cell:
    """One projection at one row count: x, C copies of W (and bias), the float32 reference."""

    def __init__(self, proj: Projection, num_rows: int) -> None:
        gen = torch.Generator(device=DEVICE).manual_seed(num_rows)
        w_bytes = proj.n * proj.k * 2
        self.copies = max(1, min(MAX_COPIES, math.ceil(COLD_BYTES / w_bytes)))
        self.x = torch.randn(num_rows, proj.k, device=DEVICE, generator=gen).to(DTYPE)
        self.weights = [(torch.randn(proj.n, proj.k, device=DEVICE, generator=gen) / proj.k**0.5).to(DTYPE)
                        for _ in range(self.copies)]
        self.bias = torch.randn(proj.n, device=DEVICE, generator=gen).to(DTYPE) if proj.has_bias else None
        w0 = self.weights[0]
        self.expected = F.linear(self.x.float(), w0.float(), None if self.bias is None else self.bias.float())
        self.expected = self.expected.to(DTYPE)
        self.num_bytes = (w_bytes + (num_rows * proj.k + num_rows * proj.n) * 2
                          + (proj.n * 2 if proj.has_bias else 0))

    def measure(self, op, copy_bw: float, with_eager: bool = True) -> dict:
        got = op(self.x, self.weights[0], self.bias)
        t_us = 1e3 * graph_ms(lambda: [op(self.x, w, self.bias) for w in self.weights]) / self.copies
        row = {"time_us": round(t_us, 2), "gb_s": round(self.num_bytes / (t_us * 1e-6) / GB, 1),
               "copy_bw_share": round(self.num_bytes / (t_us * 1e-6) / copy_bw, 3),
               "max_ulps": max_ulps(got, self.expected)}
        if with_eager:
            row["eager_us"] = round(1e3 * bench_ms(lambda: op(self.x, self.weights[0], self.bias)), 2)
        return row


def sweep(cell: Cell, copy_bw: float) -> list[dict]:
    rows = []
    n, k = cell.weights[0].shape
    for cfg in sweep_configs(n, k):
        try:
            row = cell.measure(lambda x, w, b, cfg=cfg: gemv(x, w, b, config=cfg), copy_bw, with_eager=False)
        except Exception as exc:  # a tile past the SM's shared memory or registers: listed, not timed
            rows.append({"system": "triton-sweep", "config": asdict(cfg), "error": type(exc).__name__})
            continue
        rows.append({"system": "triton-sweep", "config": asdict(cfg), **row})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder of the results JSON (default: results/)")
    parser.add_argument("--models", nargs="+", default=None, choices=MODELS,
                        help=f"default: all; with --fused {' '.join(FUSED_MODELS)}")
    parser.add_argument("--rows", nargs="+", type=int, default=None,
                        help=f"rows of x (1..8); default {' '.join(map(str, ROWS))}, with --fused 1 2")
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tiles per cell")
    parser.add_argument("--fused", action="store_true", help="time the fused norm + GEMV (+ SiLU) chains instead")
    parser.add_argument("--step", action="store_true", help="time a decode step's projections in one graph instead")
    parser.add_argument("--prefetch-steps", nargs="+", type=int, default=None,
                        help="K steps of W asked of L2 before the PDL wait to time (default: --step 0 1 2, else none)")
    parser.add_argument("--norm-variants", nargs="+", default=None,
                        help="--step: also time the fused chains' tiles at ppsmN (persistent, N programs an SM; "
                             "ppsm0: a program a block), e.g. ppsm0 ppsm1 ppsm4")
    parser.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                        help="time the shapes one rank of N holds (default 1: the whole matrices)")
    parser.add_argument("--reps", type=int, default=50, help="graph replays per --step figure (the median is kept)")
    parser.add_argument("--no-pdl", action="store_true",
                        help="launch without programmatic dependent launch (--step times both anyway)")
    args = parser.parse_args()
    if not args.models:
        args.models = ["Qwen3-8B"] if args.step else list(FUSED_MODELS if args.fused else MODELS)
    args.rows = args.rows or list((1, 2) if args.fused or args.step else ROWS)
    if args.tensor_parallel < 1:
        parser.error(f"--tensor-parallel must be 1 or more, got {args.tensor_parallel}")
    if args.step and args.tensor_parallel != 1:
        parser.error("--step times whole matrices only: leave out --tensor-parallel")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gemv needs a CUDA device")
    fused.PDL = not args.no_pdl
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_bw = copy_bandwidth()
    pdl = use_pdl(torch.empty(1, device=DEVICE))
    if args.step:
        args.prefetch_steps = args.prefetch_steps if args.prefetch_steps is not None else [0, 1, 2]
        print(f"copy bandwidth {copy_bw / GB:.0f} GB/s, {num_sms} SMs, PDL {'on' if pdl else 'OFF'}; a decode step's "
              "projections replayed from one CUDA graph, L2 flushed; share: the weights at copy bandwidth / time")
        from benchmarks.gemv_step import main_step

        return main_step(args, copy_bw)
    if args.fused:
        print(f"copy bandwidth {copy_bw / GB:.0f} GB/s, {num_sms} SMs, PDL {'on' if pdl else 'off'}; "
              "per-chain times from CUDA-graph replays of back-to-back chains on distinct weight copies, L2 flushed")
        from benchmarks.gemv_fused import main_fused

        return main_fused(args, copy_bw, num_sms)
    print(f"copy bandwidth {copy_bw / GB:.0f} GB/s, {num_sms} SMs, PDL {'on' if pdl else 'off'}; per-call times from "
          f"CUDA-graph replays of back-to-back calls on distinct W copies, L2 flushed; fused.GEMV = {fused.GEMV.value} "
          f"(the engine runs it up to {GEMV_MAX_ROWS} rows)")
    header = (f"{'model':<13} {'proj':<8} {'N':>6} {'K':>6} {'M':>2} | {'cuBLAS us':>9} {'GB/s':>5} | "
              f"{'triton us':>9} {'GB/s':>5} {'share':>5} | {'speedup':>7} {'floor us':>8} | config")
    print(f"{header}\n{'-' * len(header)}")
    results, totals = [], {}
    for model in args.models:
        for proj in projections(model, args.tensor_parallel):
            for num_rows in args.rows:
                cell = Cell(proj, num_rows)
                cfg = choose_config(proj.n, proj.k, 2, num_sms)
                base = {"model": model, "projection": proj.name, "n": proj.n, "k": proj.k,
                        "num_rows": num_rows, "bytes": cell.num_bytes, "copies": cell.copies}
                cublas = {"system": "f-linear", **cell.measure(F.linear, copy_bw)}
                ours = {"system": "triton-gemv", "config": asdict(cfg), **cell.measure(gemv, copy_bw)}
                floor_us = cell.num_bytes / copy_bw * 1e6
                results += [{**base, **cublas}, {**base, **ours},
                            {**base, "system": "floor", "time_us": round(floor_us, 2)}]
                for system, t in (("f-linear", cublas["time_us"]), ("triton-gemv", ours["time_us"]),
                                  ("floor", floor_us)):
                    key = (model, num_rows, system)
                    totals[key] = totals.get(key, 0.0) + t * proj.per_step
                kind = f"{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
                print(f"{model:<13} {proj.name:<8} {proj.n:>6} {proj.k:>6} {num_rows:>2} | "
                      f"{cublas['time_us']:>9.2f} {cublas['gb_s']:>5.0f} | {ours['time_us']:>9.2f} "
                      f"{ours['gb_s']:>5.0f} {ours['copy_bw_share']:>5.2f} | "
                      f"{cublas['time_us'] / ours['time_us']:>6.2f}x {floor_us:>8.2f} | {kind}", flush=True)
                if args.prefetch_steps and cfg.block_k < proj.k and cell.copies > 1:
                    by_steps = []
                    for steps in args.prefetch_steps:
                        tiles = replace(cfg, prefetch_steps=steps)
                        row = cell.measure(lambda x, w, b, c=tiles: gemv(x, w, b, config=c), copy_bw, with_eager=False)
                        results.append({**base, "system": "triton-gemv", "config": asdict(tiles), **row})
                        by_steps.append(f"{steps}: {row['time_us']:.2f} us")
                    print(f"{'':<40} prefetch steps " + ", ".join(by_steps), flush=True)
                if args.sweep:
                    swept = sweep(cell, copy_bw)
                    results += [{**base, **row} for row in swept]
                    timed = [r for r in swept if "time_us" in r]
                    best = min(timed, key=lambda r: r["time_us"])
                    print(f"{'':<40} sweep: best {best['time_us']:.2f} us {best['config']} "
                          f"({len(timed)} tiles timed)", flush=True)
                del cell
        torch.cuda.empty_cache()
    print("\none decode step's projections (layers x 4 + LM head), us:")
    for model in args.models:
        for num_rows in args.rows:
            f_lin, ours, floor = (totals[(model, num_rows, s)] for s in ("f-linear", "triton-gemv", "floor"))
            print(f"  {model:<13} M={num_rows}: cuBLAS {f_lin:8.1f}  triton {ours:8.1f}  floor {floor:8.1f}  "
                  f"({f_lin / ours:.2f}x)")
            results.append({"model": model, "projection": "decode-step", "num_rows": num_rows, "system": "sum",
                            "f_linear_us": round(f_lin, 1), "triton_gemv_us": round(ours, 1),
                            "floor_us": round(floor, 1)})
    settings = {"dtype": "bfloat16", "rows": args.rows, "models": args.models, "num_sms": num_sms,
                "tensor_parallel": args.tensor_parallel,
                "copy_bandwidth_gb_s": round(copy_bw / GB, 1), "gemv_default": fused.GEMV.value,
                "gemv_max_rows": GEMV_MAX_ROWS, "pdl": pdl, "prefetch_steps": args.prefetch_steps,
                "timing": "time_us: CUDA-graph replay of C back-to-back calls on C distinct W copies (>= 64 MiB), "
                          "L2 flushed before each replay, median of 50, / C; eager_us: do_bench median of plain "
                          "calls", "sweep": args.sweep, "versions": versions("triton")}
    path = write_result("gemv", settings, results, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
