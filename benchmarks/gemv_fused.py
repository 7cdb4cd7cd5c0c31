"""The decoder layer's two chains at decode sizes: ``python -m benchmarks.gemv --fused [--sweep]``.

Input norm + qkv and post-attention norm + gate_up + SiLU-and-mul (``layers/fused/gemv_fusion.py``), as one launch
(``fused``) against the launches the engine runs unfused (``separate``: rms_norm, the GEMV at its after-norm
tiles, silu_and_mul) and against those with the GEMV at its plain tiles (``separate-plain``), each timed like
``benchmarks.gemv``'s cells (a graph of C chains on C weight copies, L2 flushed); ``equal``: the fused result is
the separate one bit for bit. ``--sweep`` also times the fused chain at a grid of tiles.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, replace

import torch

from benchmarks.common import versions, write_result
from benchmarks.gemv import (COLD_BYTES, DEVICE, DTYPE, GB, MAX_COPIES, GemvConfig, Projection, projections,
                             sweep_configs)
from benchmarks.timing import graph_ms
from infer_core.layers import fused
from infer_core.layers.fused.gemv import config_after_rms_norm, gemv
from infer_core.layers.fused.norm_gemv import rms_norm_gemv
from infer_core.layers.fused.rms_norm import rms_norm
from infer_core.layers.fused.silu_and_mul import silu_and_mul


class Chain:
    """A decoder layer's norm -> projection (-> SiLU) at one row count: x, the residual, C copies of the weights."""

    def __init__(self, proj: Projection, num_rows: int) -> None:
        gen = torch.Generator(device=DEVICE).manual_seed(num_rows)
        self.silu = proj.name == "gate_up"
        self.copies = max(1, min(MAX_COPIES, math.ceil(COLD_BYTES / (proj.n * proj.k * 2))))
        self.x = torch.randn(num_rows, proj.k, device=DEVICE, generator=gen).to(DTYPE)
        self.residual = torch.randn(num_rows, proj.k, device=DEVICE, generator=gen).to(DTYPE)
        self.layers = [((1 + 0.1 * torch.randn(proj.k, device=DEVICE, generator=gen)).to(DTYPE),
                        (torch.randn(proj.n, proj.k, device=DEVICE, generator=gen) / proj.k**0.5).to(DTYPE),
                        torch.randn(proj.n, device=DEVICE, generator=gen).to(DTYPE) if proj.has_bias else None)
                       for _ in range(self.copies)]
        n_out = proj.n // 2 if self.silu else proj.n
        self.num_bytes = (proj.n * proj.k + 2 * num_rows * proj.k + proj.k + num_rows * (n_out + proj.k)) * 2

    def separate(self, norm_weight, weight, bias, *, after_norm: bool = True):
        normed, summed = rms_norm(self.x, norm_weight, 1e-6, self.residual)
        y = gemv(normed, weight, bias, after_rms_norm=after_norm, before_silu=self.silu)
        return (silu_and_mul(y) if self.silu else y), summed

    def fused(self, norm_weight, weight, bias):
        return rms_norm_gemv(self.x, norm_weight, 1e-6, weight, bias, self.residual, silu=self.silu)

    def time_us(self, op) -> float:
        return 1e3 * graph_ms(lambda: [op(*layer) for layer in self.layers]) / self.copies


def sweep_fused(chain: Chain, proj: Projection, chosen: GemvConfig, floor_us: float) -> list[dict]:
    """The fused chain at each of ``sweep_configs``' tiles (several K steps: persistent, as the engine runs them),
    printed best first beside the engine's choice. The warp count is the tile's, not the norm's, so a tile other
    than the chosen one's count gives sums other than the separate kernels' (timing only)."""
    rows = []
    for cfg in sweep_configs(proj.n, proj.k):
        if cfg.block_k < proj.k:
            cfg = replace(cfg, programs_per_sm=chosen.programs_per_sm or 2)
        try:
            t = chain.time_us(lambda nw, w, b, cfg=cfg: rms_norm_gemv(chain.x, nw, 1e-6, w, b, chain.residual,
                                                                       silu=chain.silu, config=cfg))
        except Exception as exc:  # a tile past the SM's shared memory or registers: listed, not timed
            rows.append({"system": "fused-sweep", "config": asdict(cfg), "error": type(exc).__name__})
            continue
        rows.append({"system": "fused-sweep", "config": asdict(cfg), "time_us": round(t, 2)})
    timed = sorted((r for r in rows if "time_us" in r), key=lambda r: r["time_us"])
    for r in timed[:6]:
        c = r["config"]
        print(f"    sweep {r['time_us']:8.2f} us ({floor_us / r['time_us']:.2f} of floor)  "
              f"{c['block_n']}x{c['block_k']} w{c['num_warps']} s{c['num_stages']} ppsm{c['programs_per_sm']}",
              flush=True)
    return rows


def main_fused(args, copy_bw: float, num_sms: int) -> None:
    header = (f"{'model':<13} {'chain':<22} {'M':>2} | {'separate us':>11} {'plain us':>8} | {'fused us':>8} "
              f"{'GB/s':>5} | {'speedup':>7} {'floor us':>8} | equal | fused tiles")
    print(f"{header}\n{'-' * len(header)}")
    results, saved = [], {}
    for model in args.models:
        for proj in projections(model, args.tensor_parallel):
            if proj.name not in ("qkv", "gate_up"):
                continue
            chain_name = "input-norm+qkv" if proj.name == "qkv" else "post-norm+gate_up+silu"
            for num_rows in args.rows:
                chain = Chain(proj, num_rows)
                equal = all(torch.equal(a, b) for a, b in zip(chain.fused(*chain.layers[0]),
                                                              chain.separate(*chain.layers[0])))
                times = {"separate": chain.time_us(chain.separate),
                         "separate-plain": chain.time_us(functools.partial(chain.separate, after_norm=False)),
                         "fused": chain.time_us(chain.fused)}
                floor_us = chain.num_bytes / copy_bw * 1e6
                cfg = config_after_rms_norm(proj.n, proj.k, 2, num_sms, silu=chain.silu)
                base = {"model": model, "chain": chain_name, "n": proj.n, "k": proj.k, "num_rows": num_rows,
                        "bytes": chain.num_bytes, "copies": chain.copies}
                results += [{**base, "system": system, "time_us": round(t, 2)} for system, t in times.items()]
                results[-1].update(equal=equal, config=asdict(cfg),
                                   gb_s=round(chain.num_bytes / (times["fused"] * 1e-6) / GB, 1))
                results.append({**base, "system": "floor", "time_us": round(floor_us, 2)})
                if args.sweep:
                    results += [{**base, **row} for row in sweep_fused(chain, proj, cfg, floor_us)]
                key = (model, num_rows)
                saved[key] = saved.get(key, 0.0) + (times["separate"] - times["fused"]) * proj.per_step
                print(f"{model:<13} {chain_name:<22} {num_rows:>2} | {times['separate']:>11.2f} "
                      f"{times['separate-plain']:>8.2f} | {times['fused']:>8.2f} "
                      f"{chain.num_bytes / (times['fused'] * 1e-6) / GB:>5.0f} | "
                      f"{times['separate'] / times['fused']:>6.2f}x {floor_us:>8.2f} | {equal!s:<5} | "
                      f"{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}", flush=True)
                del chain
        torch.cuda.empty_cache()
    print("\nper decode step (layers x both chains), separate - fused:")
    for (model, num_rows), us in saved.items():
        print(f"  {model:<13} M={num_rows}: {us:7.1f} us saved")
    settings = {"dtype": "bfloat16", "rows": args.rows, "models": args.models, "num_sms": num_sms,
                "copy_bandwidth_gb_s": round(copy_bw / GB, 1), "pdl": fused.PDL,
                "timing": "CUDA-graph replay of C back-to-back chains on C distinct weight copies (>= 64 MiB), "
                          "L2 flushed before each replay, median of 50, / C", "versions": versions("triton")}
    print(f"wrote {write_result('gemv-fused', settings, results, args.out)}")
