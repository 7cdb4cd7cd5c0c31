"""Tiles of the decode-size MoE GEMVs (``fused/moe_gemv.py``) at Qwen3-30B-A3B's shapes: each launch alone, per tile.

For 1, 2 and 4 tokens (top-8 of 128 experts, hidden 2048, experts of 768, bfloat16, one random routing), times
each candidate tile of the gate_up launch and of the down launch (which sums each token's top-k entries too) as
a CUDA-graph replay (L2 flushed, median of 50), beside the bytes each reads over the copy bandwidth; and the
top-k sum as the grouped path runs it (torch's float32 sum, then the cast). The first tile of each list is the
one ``moe_gemv`` chooses.

    python -m benchmarks.moe_gemv_sweep --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton

from benchmarks.timing import copy_bandwidth, graph_ms
from benchmarks.common import versions, write_result
from infer_core.layers.fused.gemv_tiles import GemvConfig, choose_config, num_sms
from infer_core.layers.fused.moe_gemv import (
    _down_kernel,
    _gate_up_kernel,
    down_prefetch_lines,
    down_tiles,
    gate_up_tiles,
)
from infer_core.layers.moe import route

E, TOP_K, H, I = 128, 8, 2048, 768
GATE_UP = [(4, 2048, 4, 1), (4, 2048, 8, 1), (8, 1024, 8, 1), (8, 2048, 8, 1), (16, 512, 8, 3), (16, 1024, 8, 1),
           (2, 2048, 4, 1), (8, 512, 4, 3), (4, 1024, 4, 3)]
DOWN = [(4, 256, 8, 2), (8, 128, 8, 2), (4, 128, 4, 2), (8, 256, 8, 2), (16, 64, 8, 2), (4, 512, 8, 2),
        (2, 256, 4, 2)]  # (BLOCK_N, BLOCK_K of each of the 8 slots, warps, stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tokens", default="1,2,4")
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=gen) * H**-0.5).bfloat16()
    down = (torch.randn(E, H, I, device="cuda", generator=gen) * I**-0.5).bfloat16()
    sms = num_sms(torch.device("cuda"))
    results = []
    for num_tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(num_tokens, H, device="cuda", generator=gen).bfloat16()
        weights, ids = route(torch.randn(num_tokens, E, device="cuda", generator=gen), TOP_K, True)
        ids, weights = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
        entries = ids.numel()
        active = len(torch.unique(ids))
        inter = torch.empty(entries, I, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(num_tokens, H, device="cuda", dtype=torch.bfloat16)
        per_entry = torch.empty(entries, H, device="cuda", dtype=torch.bfloat16)  # the grouped path's, for its sum
        chosen_gu = gate_up_tiles(entries, I, H, 2, sms)
        chosen_dn = down_tiles(num_tokens, TOP_K, H, I, 2, sms)
        candidates = {"gate_up": [(chosen_gu.block_n, chosen_gu.block_k, chosen_gu.num_warps, chosen_gu.num_stages)]
                      + GATE_UP, "down": [(chosen_dn.block_n, chosen_dn.block_k, chosen_dn.num_warps,
                                           chosen_dn.num_stages)] + DOWN}
        floors = {"gate_up": active * 2 * I * H * 2 / copy_bw * 1e6, "down": active * I * H * 2 / copy_bw * 1e6}
        for launch, tiles in candidates.items():
            want, line = None, []
            for bn, bk, warps, stages in dict.fromkeys(tiles):
                cfg = GemvConfig(bn, bk, warps, stages)
                if launch == "gate_up":
                    def run(cfg=cfg):
                        _gate_up_kernel[(entries, triton.cdiv(I, cfg.block_n))](
                            x, gate_up, ids, inter, E, I, H, x.stride(0), gate_up.stride(0), gate_up.stride(1),
                            inter.stride(0), TOP_K=TOP_K, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                            EVEN_K=H % cfg.block_k == 0, NUM_STAGES=cfg.num_stages, USE_PDL=True, launch_pdl=True,
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
                        return inter
                else:
                    def run(cfg=cfg):
                        _down_kernel[(num_tokens, triton.cdiv(H, cfg.block_n))](
                            inter, down, ids, weights, out, E, H, I, inter.stride(0), down.stride(0),
                            down.stride(1), out.stride(0), TOP_K=TOP_K, SLOTS=TOP_K, BLOCK_N=cfg.block_n,
                            BLOCK_K=cfg.block_k, EVEN_K=I % cfg.block_k == 0, NUM_STAGES=cfg.num_stages,
                            PREFETCH_LINES=down_prefetch_lines(cfg, I, 2, True), USE_PDL=True, launch_pdl=True,
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
                        return out
                got = run().clone()
                want = got if want is None else want
                same = bool(torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2))
                t_us = 1e3 * graph_ms(run)
                results.append({"num_tokens": num_tokens, "launch": launch, "block_n": bn, "block_k": bk,
                                "num_warps": warps, "num_stages": stages, "time_us": round(t_us, 2),
                                "floor_share": round(floors[launch] / t_us, 3), "close_to_first": same})
                line.append(f"{bn}x{bk}/{warps}w/{stages}s {t_us:6.1f}{'' if same else '!'}")
            print(f"T={num_tokens} {launch:<7} floor {floors[launch]:5.1f} us | " + " | ".join(line), flush=True)
        t_sum = 1e3 * graph_ms(lambda: per_entry.view(num_tokens, TOP_K, H).sum(dim=1, dtype=torch.float32).bfloat16())
        results.append({"num_tokens": num_tokens, "launch": "top-k sum + cast", "time_us": round(t_sum, 2)})
        print(f"T={num_tokens} top-k sum + cast {t_sum:6.1f} us", flush=True)
    settings = {"shapes": "qwen3-30b-a3b experts", "copy_bandwidth_gb_s": round(copy_bw / 1e9, 1),
                "timing": "CUDA-graph replay of one launch, L2 flushed, median of 50", **versions()}
    if args.out is not None:
        print(write_result("moe-gemv-sweep", settings, results, args.out))


if __name__ == "__main__":
    main()
