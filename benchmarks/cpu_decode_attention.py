"""The CPU's paged decode attention kernel (``infer_core/layers/cpu_attention.py``) alone, per call.

One layer's decode attention at the default model's shape (9 query heads, 3 KV heads, head_dim 64) over
``--rows`` rows of about ``--ctx`` keys each (each row +-40), the cache's blocks in random order, as the engine
calls it (the torch backend's thread count). Reported: the best and median microseconds a call over
``--repeats`` timings of ``--calls`` calls, and the KV bytes read a second.

    python -m benchmarks.cpu_decode_attention [--ctx 150] [--rows 32] [--dtype bfloat16] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import write_result

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 9, 3, 64, 16, 4096


def measure(ctx: int, rows: int, dtype: torch.dtype, calls: int, repeats: int) -> dict:
    from infer_core.layers import cpu_attention

    library = cpu_attention.load()
    if library is None:
        raise SystemExit("the CPU attention kernel does not build here (no C compiler)")
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    seq_lens = torch.tensor([max(1, ctx + rng.randint(-40, 40)) for _ in range(rows)], dtype=torch.int32)
    per_row = -(-int(seq_lens.max()) // BLOCK_SIZE)
    tables = torch.randperm(NUM_BLOCKS, generator=gen)[: rows * per_row].view(rows, per_row).int().contiguous()
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(dtype)
    max_keys, scale = int(seq_lens.max()), HEAD_DIM ** -0.5

    def call():
        cpu_attention.decode_attention(library, q, cache, tables, seq_lens, max_keys, scale, None)

    for _ in range(20):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls * 1e6)
    kv_bytes = int(seq_lens.sum()) * KV_HEADS * HEAD_DIM * 2 * cache.element_size()
    return {"ctx": ctx, "rows": rows, "dtype": str(dtype).removeprefix("torch."), "best_us": round(min(times), 1),
            "median_us": round(statistics.median(times), 1), "kv_mb": round(kv_bytes / 1e6, 2),
            "gb_s_at_best": round(kv_bytes / min(times) / 1e3, 2), "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=int, nargs="+", default=[150, 600])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = [measure(ctx, args.rows, getattr(torch, args.dtype), args.calls, args.repeats) for ctx in args.ctx]
    for row in results:
        print(f"ctx~{row['ctx']} rows {row['rows']} {row['dtype']}: best {row['best_us']} us, median "
              f"{row['median_us']} us, KV {row['kv_mb']} MB ({row['gb_s_at_best']} GB/s at the best)")
    print(write_result("cpu-decode-attention", vars(args) | {"out": None}, results, args.out))


if __name__ == "__main__":
    main()
