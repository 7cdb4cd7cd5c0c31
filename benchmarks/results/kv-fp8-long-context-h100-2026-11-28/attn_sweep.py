"""Probe (issue 26, long-context FP8 KV): the Triton kernels' tiles on the long-context workload's shapes.

Decode: 32 requests x 8,000 tokens, Qwen3-0.6B's 16 / 8 heads, 16-token pages (``kv_fp8_decode_sweep``'s cell),
FP8 over block_n x warps x stages x splits, bf16 at its default beside it. Prefill: one step's chunk as the
engine runs it (8,192 tokens: the last 3,900 of a 7,900-token prompt whose first 4,000 are cached, and the
first 4,292 of the next), FP8 and bf16 caches over block_m x block_n x warps x stages.

    PYTHONPATH=$PWD python benchmarks/results/kv-fp8-long-context-h100-2026-11-28/attn_sweep.py
"""

from __future__ import annotations

import itertools
import json
import sys

import torch

from benchmarks.kv_fp8_decode_sweep import CELLS, HEAD_DIM, cell
from benchmarks.timing import bench_ms
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.prefill import prefill_attention
from infer_attention_triton.tiles import DecodeTiles, PrefillTiles, decode_tiles, prefill_tiles


def decode_sweep(rows):
    batch, num_heads, num_kv_heads, lens = CELLS["long-0.6b"]
    q, bf16, fp8, table, table16, seq_lens = cell(batch, num_heads, num_kv_heads, lens)
    kv_bytes = int(seq_lens.sum()) * num_kv_heads * HEAD_DIM * 2
    scale = HEAD_DIM**-0.5

    def run(kind, cache, tiles, splits):
        scratch = SplitScratch.allocate(batch, num_heads, max(splits, 2), HEAD_DIM, "cuda")
        view = cache.view(2, -1, 16, num_kv_heads, HEAD_DIM)
        out = torch.empty_like(q)

        def fn():
            decode_attention(q, view, table16, seq_lens, out, scale=scale, num_splits=splits, tiles=tiles,
                             scratch=scratch)

        try:
            fn()
            ms = bench_ms(fn)
        except Exception as e:
            print(f"decode {kind} {tiles} splits {splits}: {type(e).__name__} {str(e)[:120]}", flush=True)
            return
        row = {"kernel": "decode", "kv": kind, "block_n": tiles.block_n, "warps": tiles.num_warps,
               "stages": tiles.num_stages, "splits": splits, "us": round(ms * 1e3, 1),
               "gb_s": round(kv_bytes * cache.element_size() / (ms * 1e-3) / 1e9, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)

    run("bf16", bf16, decode_tiles(HEAD_DIM), 2)
    for block_n, warps, stages, splits in itertools.product((64, 128, 256), (4, 8), (2, 3, 4), (1, 2, 4, 8)):
        if block_n == 256 and stages == 4:
            continue
        run("fp8", fp8, DecodeTiles(block_n, warps, stages), splits)


def prefill_sweep(rows):
    num_heads, num_kv_heads, page = 16, 8, 16
    gen = torch.Generator(device="cuda").manual_seed(0)
    seq_lens = torch.tensor([7900, 4292], dtype=torch.int32, device="cuda")
    query_lens = [3900, 4292]
    query_start_loc = torch.tensor([0, 3900, 8192], dtype=torch.int32, device="cuda")
    pages = [-(-int(s) // page) for s in seq_lens]
    num_blocks = sum(pages)
    order = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    table = torch.zeros(2, max(pages), dtype=torch.int32, device="cuda")
    table[0, :pages[0]] = order[:pages[0]]
    table[1, :pages[1]] = order[pages[0]:]
    bf16 = torch.randn(2, num_blocks, page, num_kv_heads, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    fp8 = bf16.float().to(torch.float8_e4m3fn)
    bf16 = fp8.to(torch.bfloat16)
    q = torch.randn(8192, num_heads, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    out = torch.empty_like(q)
    flops = sum(4 * num_heads * HEAD_DIM * ql * (int(s) - ql / 2) for ql, s in zip(query_lens, seq_lens.tolist()))
    ref = {}

    def run(kind, cache, tiles):
        def fn():
            prefill_attention(q, cache, table, seq_lens, query_start_loc, out, scale=HEAD_DIM**-0.5, first_req=0,
                              num_reqs=2, max_query_len=4292, tiles=tiles)

        try:
            fn()
            ms = bench_ms(fn)
        except Exception as e:
            print(f"prefill {kind} {tiles}: {type(e).__name__} {str(e)[:120]}", flush=True)
            return
        if kind not in ref:
            ref[kind] = out.float().clone()
        diff = float((out.float() - ref.get("bf16", ref[kind])).abs().max())
        row = {"kernel": "prefill", "kv": kind, "block_m": tiles.block_m, "block_n": tiles.block_n,
               "warps": tiles.num_warps, "stages": tiles.num_stages, "us": round(ms * 1e3, 1),
               "tflops": round(flops / (ms * 1e-3) / 1e12, 1), "max_diff_vs_bf16": round(diff, 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)

    default = prefill_tiles(HEAD_DIM, page)
    run("bf16", bf16, default)
    run("fp8", fp8, default)
    for bm, bn, warps, stages in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)):
        if bm == 128 and bn == 128 and warps == 4:
            continue
        for kind, cache in (("bf16", bf16), ("fp8", fp8)):
            run(kind, cache, PrefillTiles(bm, bn, warps, stages))


def main() -> None:
    rows = []
    decode_sweep(rows)
    prefill_sweep(rows)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
