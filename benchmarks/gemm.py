"""Projections at large decode batches: our Triton GEMM against F.linear (cuBLAS), on one GPU.

The four projections of each decoder layer (qkv, o, gate_up, down; shapes from ``benchmarks/configs``),
bfloat16, at the row counts of decode steps past the GEMV (16 to 256 rows: the CUDA-graph batch sizes).
Each cell is timed as ``benchmarks/gemv.py`` times it (a CUDA graph of C back-to-back calls on C distinct
copies of W, L2 flushed before each replay, median of 50, / C), for cuBLAS and for the tiles that
``infer_core.layers.fused.gemm.choose_config`` picks; ``--sweep`` also times a grid of tiles per cell
and prints the best next to the rule's, to retune it. ``max_ulps``: distance from the float32 result
rounded to bfloat16, in bfloat16 steps.

A per-model line sums one decode step's projections (layers x 4) for each system, and ``best``: per cell
the faster of cuBLAS and the rule's tiles (what the engine runs, by ``layers/fused/dense.py``'s rule).

    python -m benchmarks.gemm --out DIR [--models Qwen3-0.6B ...] [--rows 64 192] [--sweep]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from benchmarks.attention import copy_bandwidth, graph_ms
from benchmarks.common import versions, write_result
from benchmarks.gemv import CONFIGS, DTYPE, GB, MODELS, Cell, projections
from infer_core.layers import fused
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.dense import use_gemm
from infer_core.layers.fused.gemm import GemmConfig, choose_config, gemm
from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.layers.fused.silu_and_mul import silu_and_mul
from infer_core.models.config import load_model_config

ROWS = (16, 32, 64, 96, 128, 160, 192, 256)


def sweep_configs(k: int) -> list[GemmConfig]:
    """32..128-row and 32..128-column tiles, K steps of 64 (4 stages) or 128 (3), K split 1, 2 or 4 ways,
    with and without the L2 prefetch of W."""
    found = []
    for block_m in (32, 64, 128):
        for block_n in (32, 64, 128):
            for block_k, stages in ((64, 4), (128, 3)):
                for split_k in (1, 2, 4):
                    for prefetch in (False, True):
                        warps = 8 if block_m * block_n >= 128 * 128 else 4
                        cfg = GemmConfig(block_m, block_n, block_k, split_k, warps, stages, prefetch)
                        if cfg.fits(k):
                            found.append(cfg)
    return found


def kind(cfg: GemmConfig) -> str:
    return (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} st{cfg.num_stages}"
            f"{' pf' if cfg.prefetch else ''}")


def sweep(cell: Cell, copy_bw: float) -> list[dict]:
    rows = []
    n, k = cell.weights[0].shape
    for cfg in sweep_configs(k):
        try:
            row = cell.measure(lambda x, w, b, cfg=cfg: gemm(x, w, b, config=cfg), copy_bw, with_eager=False)
        except Exception as exc:  # a tile past the SM's shared memory or registers: listed, not timed
            rows.append({"system": "triton-sweep", "config": asdict(cfg), "error": type(exc).__name__})
            continue
        rows.append({"system": "triton-sweep", "config": asdict(cfg), **row})
    return rows


class LayerChain:
    """A model's decoder layers without attention, at one row count: every layer's own weights, random."""

    def __init__(self, model: str, num_rows: int) -> None:
        c = load_model_config(CONFIGS / model)
        gen = torch.Generator(device="cuda").manual_seed(num_rows)
        self.q_size, self.eps = c.num_heads * c.head_dim, 1e-6
        shapes = {p.name: (p.n, p.k) for p in projections(model)}

        def randn(*shape, scale=1.0):
            return (scale * torch.randn(*shape, device="cuda", generator=gen)).to(DTYPE)

        self.layers = [{"norm1": 1 + randn(c.hidden_size, scale=0.1), "norm2": 1 + randn(c.hidden_size, scale=0.1),
                        **{name: randn(*shapes[name], scale=shapes[name][1] ** -0.5)
                           for name in ("qkv", "o", "gate_up", "down")}} for _ in range(c.num_layers)]
        self.x = randn(num_rows, c.hidden_size)
        self.residual = randn(num_rows, c.hidden_size)

    def forward(self, linear) -> torch.Tensor:
        x, residual = self.x, self.residual
        for layer in self.layers:
            h, residual = rms_norm(x, layer["norm1"], self.eps, residual)
            qkv = linear(h, layer["qkv"], "qkv")
            h, residual = rms_norm(linear(qkv[:, : self.q_size], layer["o"], "o"), layer["norm2"], self.eps, residual)
            x = linear(silu_and_mul(linear(h, layer["gate_up"], "gate_up")), layer["down"], "down")
        return x

    def layer_us(self, linear) -> float:
        return 1e3 * graph_ms(lambda: self.forward(linear)) / len(self.layers)


def time_layers(model: str, num_rows: int, best: dict[str, GemmConfig]) -> dict[str, float]:
    """us per layer of the chain for cuBLAS, the rule's tiles and (given) each projection's best swept tiles."""
    chain = LayerChain(model, num_rows)
    systems = {"f-linear": lambda x, w, name: F.linear(x, w),
               "triton-gemm": lambda x, w, name: gemm(x, w)}
    if best:
        systems["triton-best"] = lambda x, w, name: gemm(x, w, config=best[name])
    return {system: round(chain.layer_us(linear), 2) for system, linear in systems.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder of the results JSON (default: results/)")
    parser.add_argument("--models", nargs="+", default=["Qwen3-0.6B"], choices=MODELS)
    parser.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tiles per cell")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gemm needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_bw = copy_bandwidth()
    pdl = use_pdl(torch.empty(1, device="cuda"))
    print(f"copy bandwidth {copy_bw / GB:.0f} GB/s, {num_sms} SMs, PDL {'on' if pdl else 'off'}; per-call times from "
          "CUDA-graph replays of back-to-back calls on distinct W copies, L2 flushed")
    header = (f"{'model':<11} {'proj':<8} {'N':>6} {'K':>6} {'M':>3} | {'cuBLAS us':>9} {'GB/s':>5} | "
              f"{'triton us':>9} {'GB/s':>5} {'ulps':>4} | {'speedup':>7} {'floor us':>8} | engine | config")
    print(f"{header}\n{'-' * len(header)}")
    results, totals = [], {}
    best_tiles: dict[tuple[str, int], dict[str, GemmConfig]] = {}
    started = time.monotonic()
    for model in args.models:
        for proj in projections(model):
            if proj.name == "lm_head":
                continue
            for num_rows in args.rows:
                cell = Cell(proj, num_rows)
                cfg = choose_config(num_rows, proj.n, proj.k, num_sms)
                engine = "triton" if use_gemm(fused.GEMM, cell.x, cell.weights[0]) else "cublas"
                base = {"model": model, "projection": proj.name, "n": proj.n, "k": proj.k,
                        "num_rows": num_rows, "bytes": cell.num_bytes, "copies": cell.copies, "engine": engine}
                cublas = {"system": "f-linear", **cell.measure(F.linear, copy_bw)}
                ours = {"system": "triton-gemm", "config": asdict(cfg), **cell.measure(gemm, copy_bw)}
                floor_us = cell.num_bytes / copy_bw * 1e6
                results += [{**base, **cublas}, {**base, **ours},
                            {**base, "system": "floor", "time_us": round(floor_us, 2)}]
                best = ours["time_us"] if engine == "triton" else cublas["time_us"]
                for system, t in (("f-linear", cublas["time_us"]), ("triton-gemm", ours["time_us"]),
                                  ("engine", best), ("floor", floor_us)):
                    key = (model, num_rows, system)
                    totals[key] = totals.get(key, 0.0) + t * proj.per_step
                print(f"{model:<11} {proj.name:<8} {proj.n:>6} {proj.k:>6} {num_rows:>3} | "
                      f"{cublas['time_us']:>9.2f} {cublas['gb_s']:>5.0f} | {ours['time_us']:>9.2f} "
                      f"{ours['gb_s']:>5.0f} {ours['max_ulps']:>4.1f} | "
                      f"{cublas['time_us'] / ours['time_us']:>6.2f}x {floor_us:>8.2f} | {engine:<6} | {kind(cfg)}",
                      flush=True)
                if args.sweep:
                    swept = sweep(cell, copy_bw)
                    results += [{**base, **row} for row in swept]
                    timed = sorted((r for r in swept if "time_us" in r), key=lambda r: r["time_us"])
                    best_tiles.setdefault((model, num_rows), {})[proj.name] = GemmConfig(**timed[0]["config"])
                    top = ", ".join(f"{r['time_us']:.2f} {kind(GemmConfig(**r['config']))}" for r in timed[:3])
                    print(f"{'':<39} sweep best: {top} ({len(timed)} timed, {time.monotonic() - started:.0f} s)",
                          flush=True)
                del cell
        torch.cuda.empty_cache()
    print("\na decoder layer's chain without attention (norm, qkv, o, norm, gate_up, silu, down), us per layer:")
    for model in args.models:
        for num_rows in args.rows:
            layer = time_layers(model, num_rows, best_tiles.get((model, num_rows), {}))
            print(f"  {model:<11} M={num_rows:>3}: " + "  ".join(f"{k} {v:6.2f}" for k, v in layer.items()), flush=True)
            results.append({"model": model, "projection": "layer-chain", "num_rows": num_rows, "system": "layer_us",
                            **layer})
            torch.cuda.empty_cache()
    print("\none decode step's projections (layers x 4), us:")
    for model in args.models:
        for num_rows in args.rows:
            f_lin, ours, best, floor = (totals[(model, num_rows, s)]
                                        for s in ("f-linear", "triton-gemm", "engine", "floor"))
            print(f"  {model:<11} M={num_rows:>3}: cuBLAS {f_lin:7.1f}  triton {ours:7.1f}  engine {best:7.1f}  "
                  f"floor {floor:7.1f}  ({f_lin / best:.2f}x)")
            results.append({"model": model, "projection": "decode-step", "num_rows": num_rows, "system": "sum",
                            "f_linear_us": round(f_lin, 1), "triton_gemm_us": round(ours, 1),
                            "engine_us": round(best, 1), "floor_us": round(floor, 1)})
    settings = {"dtype": "bfloat16", "rows": args.rows, "models": args.models, "num_sms": num_sms,
                "copy_bandwidth_gb_s": round(copy_bw / GB, 1), "gemm_default": fused.GEMM.value, "pdl": pdl,
                "timing": "time_us: CUDA-graph replay of C back-to-back calls on C distinct W copies (>= 64 MiB), "
                          "L2 flushed before each replay, median of 50, / C", "sweep": args.sweep,
                "versions": versions("triton")}
    print(f"wrote {write_result('gemm', settings, results, args.out)}")


if __name__ == "__main__":
    main()
