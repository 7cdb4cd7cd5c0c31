"""The experts of one mixture-of-experts layer on one GPU: our fused path against a loop of per-expert cuBLAS GEMMs
and against the bytes floor of the experts the step routes to.

Shapes: Qwen3-30B-A3B (128 experts, top-8, hidden 2048, experts of 768) and Mixtral-8x7B (8 experts, top-2,
hidden 4096, experts of 14336), bfloat16, one random routing per token count. Systems, each a CUDA-graph replay
(no host launch cost), median of 50, L2 emptied before each by reading 256 MiB (``--l2-flush read``: clean lines, as
a decode step finds L2; ``write`` zeroes 256 MiB instead, whose dirty lines the replay then writes back, which
costs a 1-token launch about 10 us; the results before 2026-11-27f used ``write``):

- ``fused``: what the layer runs from its router logits: the one-launch router, then at decode sizes
  (``moe_gemv.use_moe_gemv``) the two GEMV launches over the entries, else the grouping by expert, the gate_up
  grouped GEMM (with SiLU-and-mul) and the down grouped GEMM (with the routing weight); the top-k sum;
- ``grouped``: the router and the grouped path at every size (the decode sizes' alternative);
- ``experts-only``: ``fused`` without its router (and grouping), done before;
- ``loop``: for every expert that got tokens, a gather of its tokens, ``F.linear`` for gate_up and down (cuBLAS),
  SiLU-and-mul, the weight, ``index_add_`` (the routing read on the host before the capture, as an eager loop
  must each step).

``floor_us``: the bytes of the experts the step routes to (each read once) and of x and the output, over the
device-to-device copy bandwidth measured in the same run; ``floor_share`` is that over the fused time.

    python3 -m benchmarks.moe_kernel --out DIR [--tokens 1,16,64] [--l2-flush read|write]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.timing import copy_bandwidth, graph_ms
from benchmarks.common import versions, write_result
from infer_core.layers.moe.align import align_by_expert

DTYPE = torch.bfloat16
TOKENS = (1, 2, 4, 8, 16, 64, 256, 2048)


@dataclass(frozen=True, slots=True)
class MoEShape:
    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int


SHAPES = (MoEShape("qwen3-30b-a3b", 128, 8, 2048, 768), MoEShape("mixtral-8x7b", 8, 2, 4096, 14336))


def systems(shape: MoEShape, num_tokens: int, gen: torch.Generator):
    """(name -> callable, active experts) for one routing of ``num_tokens`` random tokens."""
    from infer_core.layers.fused.moe_align import MAX_ENTRIES, moe_align
    from infer_core.layers.fused.moe_gemm import choose_tiles, fused_experts
    from infer_core.layers.fused.moe_gemv import moe_gemv_experts, use_moe_gemv
    from infer_core.layers.fused.moe_route import moe_route

    e, h, i = shape.num_experts, shape.hidden, shape.intermediate
    gate_up = (torch.randn(e, 2 * i, h, device="cuda", generator=gen) * h**-0.5).to(DTYPE)
    down = (torch.randn(e, h, i, device="cuda", generator=gen) * i**-0.5).to(DTYPE)
    x = torch.randn(num_tokens, h, device="cuda", generator=gen).to(DTYPE)
    logits = torch.randn(num_tokens, e, device="cuda", generator=gen).to(DTYPE)
    weights, ids = moe_route(logits, shape.top_k, True)
    tiles = choose_tiles(ids.numel(), e)
    align = moe_align if ids.numel() <= MAX_ENTRIES else align_by_expert

    gemv = use_moe_gemv(num_tokens, shape.top_k, e)

    def grouped():
        w, d = moe_route(logits, shape.top_k, True)
        return fused_experts(x, gate_up, down, w, align(d, e, tiles.block_m), tiles)

    def fused():
        if not gemv:
            return grouped()
        w, d = moe_route(logits, shape.top_k, True)
        return moe_gemv_experts(x, gate_up, down, w, d)

    blocks = align(ids, e, tiles.block_m)

    def experts_only():
        if gemv:
            return moe_gemv_experts(x, gate_up, down, weights, ids)
        return fused_experts(x, gate_up, down, weights, blocks, tiles)

    per_expert = []
    for expert in torch.unique(ids).tolist():
        tokens, slot = torch.where(ids == expert)
        per_expert.append((expert, tokens, weights[tokens, slot, None]))

    def loop():
        out = torch.zeros_like(x)
        for expert, tokens, w in per_expert:
            gate, up = F.linear(x[tokens], gate_up[expert]).chunk(2, dim=-1)
            out.index_add_(0, tokens, (F.linear(F.silu(gate) * up, down[expert]) * w).to(x.dtype))
        return out

    return {"fused": fused, "grouped": grouped, "experts-only": experts_only, "loop": loop}, len(per_expert)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder of the results JSON (default: results/)")
    parser.add_argument("--tokens", default=None, help=f"comma-separated token counts (default: {TOKENS})")
    parser.add_argument("--l2-flush", choices=("write", "read"), default="read",
                        help="how L2 is emptied before each replay (benchmarks.timing.graph_ms): zeroing 256 MiB "
                             "(dirty lines the replay writes back) or summing it (clean lines)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.moe_kernel needs a CUDA device")
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else TOKENS
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s; times are CUDA-graph replays, L2 flushed ({args.l2_flush})")
    print(f"{'model':<14} {'T':>5} {'active':>6} | {'fused us':>9} {'grouped us':>10} {'experts us':>10} {'loop us':>9} | "
          f"{'floor us':>8} {'share':>5} {'vs loop':>7}")
    results = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in SHAPES:
        for num_tokens in tokens:
            calls, active = systems(shape, num_tokens, gen)
            times = {name: 1e3 * graph_ms(fn, l2_flush=args.l2_flush) for name, fn in calls.items()}
            num_bytes = (active * 3 * shape.hidden * shape.intermediate + 2 * num_tokens * shape.hidden) * 2
            floor_us = 1e6 * num_bytes / copy_bw
            row = {"model": shape.name, "num_tokens": num_tokens, "active_experts": active, "bytes": num_bytes,
                   **{f"{name}_us": t for name, t in times.items()}, "floor_us": floor_us,
                   "floor_share": floor_us / times["fused"], "speedup_vs_loop": times["loop"] / times["fused"]}
            results.append(row)
            print(f"{shape.name:<14} {num_tokens:>5} {active:>6} | {times['fused']:>9.1f} {times['grouped']:>10.1f} "
                  f"{times['experts-only']:>10.1f} "
                  f"{times['loop']:>9.1f} | {floor_us:>8.1f} {row['floor_share']:>5.2f} {row['speedup_vs_loop']:>6.2f}x",
                  flush=True)
    settings = {"dtype": "bfloat16", "tokens": list(tokens), "copy_bandwidth_gb_s": copy_bw / 1e9,
                "l2_flush": args.l2_flush, **versions()}
    print(write_result("moe_kernel", settings, results, args.out))


if __name__ == "__main__":
    main()
