"""The Triton decode kernel over an FP8 cache against itself over bfloat16 and flash-attn: which tiles make the
halved reads pay (issue 26: FP8 KV was slower than a bfloat16 cache on the same kernel). The bfloat16-dot rows of
call P3 (``benchmarks/results/gpu-calls-2026-11-27c/``) came from this script at 23e9fa4, when the kernel took that
choice as an argument.

Two cells, one GPU, the same run: the offline workload's decode (256 requests, contexts drawn from 200-2,000
tokens, Qwen3-8B's 32 query and 8 KV heads) and the long-context one (32 requests of 8,000 tokens, Qwen3-0.6B's
16 and 8). Each cell's cache is written once in bfloat16 and once as e4m3 of the same values (scale 1), in pages
of 256 tokens shuffled, and read as 256- and as 16-token pages (the Triton backend's default). Rows: time
(median, L2 flushed), GB/s of the K/V bytes read, the output's largest difference from the bfloat16 cache's.

    python -m benchmarks.kv_fp8_decode_sweep [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from benchmarks.timing import bench_ms
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.tiles import DecodeTiles, choose_num_splits, decode_tiles

PAGE, HEAD_DIM = 256, 128
CELLS = {"offline-8b": (256, 32, 8, (200, 2000)), "long-0.6b": (32, 16, 8, (8000, 8000))}


def cell(batch, num_heads, num_kv_heads, lens, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lo, hi = lens
    seq_lens = torch.randint(lo, hi + 1, (batch,), generator=gen, device="cuda", dtype=torch.int32)
    pages = (-(-seq_lens // PAGE)).tolist()
    num_blocks = sum(pages)
    bf16 = torch.randn(2, num_blocks, PAGE, num_kv_heads, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    fp8 = bf16.float().clamp(-448, 448).to(torch.float8_e4m3fn)
    bf16 = fp8.to(torch.bfloat16)  # the same values in both caches
    order = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    table = torch.zeros(batch, max(pages), dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(pages):
        table[i, :n] = order[used:used + n]
        used += n
    sub = PAGE // 16
    table16 = (table[:, :, None] * sub + torch.arange(sub, device="cuda", dtype=torch.int32)).flatten(1)
    q = torch.randn(batch, num_heads, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    return q, bf16, fp8, table, table16, seq_lens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        flash_attn_with_kvcache = None
    rows = []
    for name, (batch, num_heads, num_kv_heads, lens) in CELLS.items():
        q, bf16, fp8, table, table16, seq_lens = cell(batch, num_heads, num_kv_heads, lens)
        kv_bytes = int(seq_lens.sum()) * num_kv_heads * HEAD_DIM * 2
        max_len = int(seq_lens.max())
        scale = HEAD_DIM**-0.5
        reference = None

        def run(system, cache, page, tbl, tiles, splits=None):
            nonlocal reference
            splits = splits or choose_num_splits(batch, num_kv_heads, max_len, num_sms, tiles.block_n)
            scratch = SplitScratch.allocate(batch, num_heads, splits, HEAD_DIM, "cuda")
            view = cache.view(2, -1, page, num_kv_heads, HEAD_DIM)
            out = torch.empty_like(q)

            def fn():
                decode_attention(q, view, tbl, seq_lens, out, scale=scale, num_splits=splits, tiles=tiles,
                                 scratch=scratch)

            fn()
            ms = bench_ms(fn)
            if reference is None:
                reference = out.float().clone()
            row = {"cell": name, "system": system, "page": page, "block_n": tiles.block_n, "warps": tiles.num_warps,
                   "stages": tiles.num_stages, "splits": splits,
                   "time_us": round(ms * 1e3, 1),
                   "gb_s": round(kv_bytes * cache.element_size() / (ms * 1e-3) / 1e9, 1),
                   "max_diff": round(float((out.float() - reference).abs().max()), 5)}
            rows.append(row)
            print(json.dumps(row), flush=True)

        default = decode_tiles(HEAD_DIM)
        for page, tbl in ((16, table16), (PAGE, table)):
            run("bf16", bf16, page, tbl, default)
        if flash_attn_with_kvcache is not None:
            def flash():
                return flash_attn_with_kvcache(q.unsqueeze(1), bf16[0], bf16[1], cache_seqlens=seq_lens,
                                               block_table=table, softmax_scale=scale, causal=True)
            ms = bench_ms(flash)
            rows.append({"cell": name, "system": "flash-attn bf16", "page": PAGE, "time_us": round(ms * 1e3, 1),
                         "gb_s": round(kv_bytes * 2 / (ms * 1e-3) / 1e9, 1),
                         "max_diff": round(float((flash().squeeze(1).float() - reference).abs().max()), 5)})
            print(json.dumps(rows[-1]), flush=True)
        for page, tbl in ((16, table16), (PAGE, table)):
            for block_n, warps, stages in itertools.product((64, 128), (4, 8), (2, 3, 4)):
                run("fp8", fp8, page, tbl, DecodeTiles(block_n, warps, stages))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
