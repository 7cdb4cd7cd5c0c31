"""Tuning probes of the attention kernels (``benchmarks/attention.py --sweep / --probe / --merge``), printed, not
written: decode and prefill tiles and split counts, small decode cells eager against CUDA-graph replays, and
split-K decode merged in its own launch against a second one."""

from __future__ import annotations

import itertools

import torch
import triton
import triton.testing

from benchmarks.attention import (DTYPE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, SCALE, PagedCells, flash_attn_with_kvcache,
                                  prefill_flops)
from benchmarks.timing import bench_ms, graph_ms
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.prefill import prefill_attention
from infer_attention_triton.tiles import DecodeTiles, PrefillTiles, choose_num_splits, decode_tiles

DECODE_VARIANTS = [
    DecodeTiles(*t)
    for t in ((32, 4, 3), (64, 2, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 3), (128, 8, 3))
]
PREFILL_VARIANTS = [
    PrefillTiles(*t)
    for t in (
        (64, 64, 4, 3),
        (128, 32, 4, 3),
        (128, 64, 4, 3),
        (128, 64, 8, 2),
        (128, 64, 8, 3),
        (128, 64, 8, 4),
        (128, 128, 8, 3),
        (64, 32, 4, 4),
    )
]


def quick_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def sweep(num_sms: int) -> None:
    """Tile and split variants on a few cells, printed for tuning (not written to the results)."""
    for batch, context in ((8, 8192), (64, 8192), (256, 2048), (1, 32768)):
        cells = PagedCells(batch, [context] * batch, [1] * batch)
        bytes_read = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * 2
        base = choose_num_splits(batch, NUM_KV_HEADS, context, num_sms, 64)
        found = []
        for tiles, splits in itertools.product(DECODE_VARIANTS, sorted({base, base * 2})):
            scratch = SplitScratch.allocate(batch, NUM_HEADS, splits, HEAD_DIM, "cuda")
            out = torch.empty_like(cells.q)
            for page, cache, table in (
                (256, cells.kv_cache, cells.block_table),
                (16, cells.kv_cache_16, cells.block_table_16),
            ):
                try:
                    ms = quick_ms(
                        lambda: decode_attention(
                            cells.q,
                            cache,
                            table,
                            cells.seq_lens,
                            out,
                            scale=SCALE,
                            num_splits=splits,
                            tiles=tiles,
                            scratch=scratch,
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - a variant that does not compile is skipped
                    print(f"  skip {tiles} splits={splits}: {type(exc).__name__}: {exc}"[:300])
                    continue
                found.append((ms, page, tiles, splits, bytes_read / ms / 1e6))
        found.sort(key=lambda f: f[0])
        for page in (256, 16):
            top = [f for f in found if f[1] == page][:5]
            print(
                f"sweep decode b={batch} ctx={context} page={page}: "
                + "; ".join(
                    f"n{t.block_n} w{t.num_warps} s{t.num_stages} x{sp}: {ms * 1e3:.1f}us {bw:.0f}GB/s"
                    for ms, _, t, sp, bw in top
                ),
                flush=True,
            )
        del cells
        torch.cuda.empty_cache()
    for prefix in (0, 1024):
        cells = PagedCells(8, [prefix + 2048] * 8, [2048] * 8, seed=1)
        flops = prefill_flops(cells)
        found = []
        for tiles in PREFILL_VARIANTS:
            out = torch.empty_like(cells.q)
            for page, cache, table in (
                (256, cells.kv_cache, cells.block_table),
                (16, cells.kv_cache_16, cells.block_table_16),
            ):
                try:
                    ms = quick_ms(
                        lambda: prefill_attention(
                            cells.q,
                            cache,
                            table,
                            cells.seq_lens,
                            cells.query_start_loc,
                            out,
                            scale=SCALE,
                            first_req=0,
                            num_reqs=8,
                            max_query_len=2048,
                            tiles=tiles,
                        )
                    )
                except Exception as exc:  # noqa: BLE001
                    print(f"  skip {tiles}: {type(exc).__name__}: {exc}"[:300])
                    continue
                found.append((ms, page, tiles, flops / ms / 1e9))
        found.sort(key=lambda f: f[0])
        for page in (256, 16):
            top = [f for f in found if f[1] == page][:5]
            print(
                f"sweep prefill prefix={prefix} page={page}: "
                + "; ".join(
                    f"m{t.block_m} n{t.block_n} w{t.num_warps} s{t.num_stages}: {ms * 1e3:.0f}us {tf:.0f}TF/s"
                    for ms, _, t, tf in top
                ),
                flush=True,
            )


def probe_small_decode() -> None:
    """Small decode cells, eager (do_bench) and replayed from a CUDA graph, per split count: how much
    of their time is launch overhead rather than the kernels (printed, not written)."""
    for batch, context in ((1, 512), (8, 512), (8, 2048), (64, 512)):
        cells = PagedCells(batch, [context] * batch, [1] * batch)
        out = torch.empty_like(cells.q)
        line = []
        for splits in (1, 2, 4, 8):
            scratch = SplitScratch.allocate(batch, NUM_HEADS, splits, HEAD_DIM, "cuda")

            def ours(splits=splits, scratch=scratch):
                decode_attention(
                    cells.q,
                    cells.kv_cache,
                    cells.block_table,
                    cells.seq_lens,
                    out,
                    scale=SCALE,
                    num_splits=splits,
                    tiles=decode_tiles(HEAD_DIM),
                    scratch=scratch,
                )

            eager, graph = bench_ms(ours), graph_ms(ours)
            line.append(f"x{splits}: {eager * 1e3:.1f}us eager / {graph * 1e3:.1f}us graph")
        if flash_attn_with_kvcache is not None:

            def flash():
                flash_attn_with_kvcache(
                    cells.q.unsqueeze(1),
                    cells.kv_cache[0],
                    cells.kv_cache[1],
                    cache_seqlens=cells.seq_lens,
                    block_table=cells.block_table,
                    softmax_scale=SCALE,
                    causal=True,
                )

            eager, graph = bench_ms(flash), graph_ms(flash)
            line.append(f"flash: {eager * 1e3:.1f}us eager / {graph * 1e3:.1f}us graph")
        print(f"probe decode b={batch} ctx={context}: " + "; ".join(line), flush=True)


MERGE_LAYERS = 28  # Qwen3-0.6B's (and -8B's 36 is close): one decode launch per layer and step


def probe_merge(num_sms: int) -> None:
    """Split-K decode merged in its own launch vs by a second launch, as in a decode step: one CUDA
    graph of a decode launch per layer (each layer its own cache, L2 flushed before each replay),
    sharing one scratch. Per-launch time, and whether the outputs agree bit for bit (printed only)."""
    tiles = decode_tiles(HEAD_DIM)
    for (num_heads, num_kv_heads), max_model_len, batch, context in itertools.product(
        ((16, 8), (32, 8)), (8192, 40960), (1, 4, 16), (256, 2048)
    ):
        splits = choose_num_splits(batch, num_kv_heads, max_model_len, num_sms, tiles.block_n)
        if splits == 1:
            continue
        gen = torch.Generator(device="cuda").manual_seed(batch)
        pages = -(-context // 16)
        caches = [
            torch.randn(2, batch * pages, 16, num_kv_heads, HEAD_DIM, dtype=DTYPE, device="cuda", generator=gen)
            for _ in range(MERGE_LAYERS)
        ]
        table = torch.randperm(batch * pages, device="cuda", generator=gen).to(torch.int32).view(batch, pages)
        seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        q = torch.randn(MERGE_LAYERS, batch, num_heads, HEAD_DIM, dtype=DTYPE, device="cuda", generator=gen)
        out, times = {}, {}
        for merge_in_kernel in (True, False):
            scratch = SplitScratch.allocate(batch, num_heads, splits, HEAD_DIM, "cuda")
            out[merge_in_kernel] = torch.empty_like(q)

            def step(merge_in_kernel=merge_in_kernel, scratch=scratch, caches=caches):
                for layer in range(MERGE_LAYERS):
                    decode_attention(
                        q[layer], caches[layer], table, seq_lens, out[merge_in_kernel][layer], scale=SCALE,
                        num_splits=splits, tiles=tiles, scratch=scratch, merge_in_kernel=merge_in_kernel,
                    )  # fmt: skip

            times[merge_in_kernel] = graph_ms(step, reps=100) * 1e3 / MERGE_LAYERS
        saved = times[False] - times[True]
        print(
            f"merge heads={num_heads}/{num_kv_heads} max_model_len={max_model_len} b={batch} ctx={context} "
            f"splits={splits}: one launch {times[True]:.2f}us/layer, two launches {times[False]:.2f}us/layer, "
            f"saved {saved:.2f}us/layer = {saved * MERGE_LAYERS:.1f}us/step; "
            f"bit-identical: {torch.equal(out[True], out[False])}",
            flush=True,
        )
        del caches
        torch.cuda.empty_cache()
