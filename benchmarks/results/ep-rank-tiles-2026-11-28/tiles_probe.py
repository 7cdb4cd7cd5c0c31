"""Probe: the MoE experts path (grouping, gate_up and down grouped GEMMs, top-k sum) of one Qwen3-30B-A3B layer at
decode-batch token counts, for candidate tile sets, on one GPU's 128 experts and on an EP=2 rank's 64 of 128
(the other rank's entries carry id 64 and are left out, as the layer passes them). CUDA-graph replays, L2 emptied
with clean lines before each (``benchmarks.timing.graph_ms(l2_flush="read")``); GB/s counts the active experts'
bytes once.

    python3 benchmarks/results/ep-rank-tiles-2026-11-28/tiles_probe.py OUT.json
"""

import json
import sys

import torch

from benchmarks.timing import copy_bandwidth, graph_ms
from infer_core.layers.fused.moe_align import MAX_ENTRIES, moe_align
from infer_core.layers.fused.moe_gemm import MoETiles, choose_tiles, fused_experts
from infer_core.layers.fused.moe_route import moe_route
from infer_core.layers.moe.align import align_by_expert

E, TOP_K, H, I = 128, 8, 2048, 768
TILES = {
    "m16n64k128": MoETiles(16, 64, 128, 1, 4, 3),
    "m32n64k64": MoETiles(32, 64, 64, 4, 4, 3),
    "m64n128k64w8": MoETiles(64, 128, 64, 8, 8, 3),
    "m16n32k128s4": MoETiles(16, 32, 128, 1, 4, 4),
    "m32n32k64s4": MoETiles(32, 32, 64, 4, 4, 4),
    "m32n64k128": MoETiles(32, 64, 128, 4, 4, 3),
    "m16n64k64s4": MoETiles(16, 64, 64, 1, 4, 4),
    "m32n64k64s4": MoETiles(32, 64, 64, 4, 4, 4),
    "m64n64k64": MoETiles(64, 64, 64, 8, 4, 3),
    "m32n128k64": MoETiles(32, 128, 64, 4, 4, 3),
    "m16n128k128": MoETiles(16, 128, 128, 1, 4, 3),
}
TOKENS = (64, 96, 128, 160, 192, 256, 320, 384, 512, 2048, 8192)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=gen) * H**-0.5).to(torch.bfloat16)
    down = (torch.randn(E, H, I, device="cuda", generator=gen) * I**-0.5).to(torch.bfloat16)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for num_tokens in TOKENS:
        x = torch.randn(num_tokens, H, device="cuda", generator=gen).to(torch.bfloat16)
        logits = torch.randn(num_tokens, E, device="cuda", generator=gen).to(torch.bfloat16)
        weights, ids = moe_route(logits, TOP_K, True)
        rank_ids = torch.where(ids < E // 2, ids, torch.full_like(ids, E // 2))
        for who, num_local, topk_ids in (("one-gpu", E, ids), ("ep2-rank0", E // 2, rank_ids)):
            active = int(torch.unique(topk_ids[topk_ids < num_local]).numel())
            nbytes = active * 3 * H * I * 2
            local_entries = int((topk_ids < num_local).sum())
            w_up, w_down = gate_up[:num_local], down[:num_local]
            align = moe_align if topk_ids.numel() <= MAX_ENTRIES else align_by_expert
            chosen = choose_tiles(topk_ids.numel(), num_local)
            times = {}
            for name, tiles in TILES.items():
                def run(tiles=tiles):
                    blocks = align(topk_ids, num_local, tiles.block_m)
                    return fused_experts(x, w_up, w_down, weights, blocks, tiles,
                                         local_ids=topk_ids if num_local < E else None)
                times[name] = 1e3 * graph_ms(run, l2_flush="read")
            chosen_name = next(n for n, t in TILES.items() if t == chosen)
            best = min(times, key=times.get)
            row = {"who": who, "num_tokens": num_tokens, "local_entries": local_entries, "active_experts": active,
                   "bytes": nbytes, "times_us": times, "chosen": chosen_name, "best": best,
                   "floor_us": 1e6 * nbytes / copy_bw}
            rows.append(row)
            line = " ".join(f"{n}={t:.0f}" for n, t in sorted(times.items(), key=lambda kv: kv[1])[:5])
            print(f"{who:<9} T={num_tokens:>5} entries={local_entries:>5} active={active:>3} chosen {chosen_name}="
                  f"{times[chosen_name]:.0f} us ({nbytes / times[chosen_name] / 1e3:.0f} GB/s) | best: {line}",
                  flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"copy_bandwidth_gb_s": copy_bw / 1e9, "device": torch.cuda.get_device_name(), "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
