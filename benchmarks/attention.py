"""Attention kernels on one GPU: our Triton decode/prefill against flash-attn and the torch backend.

Same run, same inputs: one bfloat16 paged cache per cell (32 query heads, 8 KV heads, head_dim
128, pages of 256 tokens in a shuffled order) is read by flash-attn (``flash_attn_with_kvcache`` /
``flash_attn_varlen_func`` with ``block_table``), by our kernels over 256-token pages and over the
same memory viewed as 16-token pages, and by the ``torch`` backend where its gathered copy fits.
Decode figures: time, GB/s of K, V and Q read once, and that as a share of the device-to-device
copy bandwidth measured in the same run. Prefill: time and TFLOP/s of the causal attention.

    python benchmarks/attention.py [--out DIR] [--quick] [--sweep] [--probe] [--merge]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infer_core.interfaces import AttentionLayer, BatchMetadata  # noqa: E402

from benchmarks.common import versions, write_result  # noqa: E402
from benchmarks.timing import bench_ms, copy_bandwidth, graph_ms  # noqa: E402
from infer_attention_triton.decode import SplitScratch, decode_attention  # noqa: E402
from infer_attention_triton.prefill import prefill_attention  # noqa: E402
from infer_attention_triton.tiles import choose_num_splits, decode_tiles, prefill_tiles  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
SCALE = HEAD_DIM**-0.5
PAGE = 256
DECODE_BATCHES = (1, 8, 64, 256)
DECODE_CONTEXTS = (512, 2048, 8192, 32768)
GRAPH_BELOW_TOKENS = 1 << 16  # decode cells this small are also timed as CUDA-graph replays
TORCH_MAX_TOKENS = 1 << 19  # the torch backend gathers every context: only cells up to 512k tokens
GB = 1e9

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError:  # the rows of flash-attn are left out
    flash_attn_varlen_func = flash_attn_with_kvcache = None


class PagedCells:
    """One shuffled-page cache, its block tables at 256- and 16-token pages, and the query."""

    def __init__(self, batch: int, seq_lens: list[int], num_query: list[int], seed: int = 0) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        pages = [-(-s // PAGE) for s in seq_lens]
        num_spare = -(-sum(num_query) // PAGE)  # where the torch backend writes the new tokens' K/V
        num_blocks = sum(pages) + num_spare
        self.kv_cache = torch.randn(
            2, num_blocks, PAGE, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen
        )
        order = torch.randperm(num_blocks - num_spare, device="cuda", generator=gen).to(torch.int32)
        first_spare_slot = (num_blocks - num_spare) * PAGE
        self.spare_slots = torch.arange(sum(num_query), dtype=torch.int32, device="cuda") + first_spare_slot
        width = max(pages)
        self.block_table = torch.zeros(batch, width, dtype=torch.int32, device="cuda")
        used = 0
        for i, n in enumerate(pages):
            self.block_table[i, :n] = order[used : used + n]
            used += n
        # The same memory as 16-token pages: page b of 256 is pages 16b .. 16b+15 of 16.
        sub = PAGE // 16
        self.kv_cache_16 = self.kv_cache.view(2, num_blocks * sub, 16, NUM_KV_HEADS, HEAD_DIM)
        self.block_table_16 = (
            self.block_table[:, :, None] * sub + torch.arange(sub, device="cuda", dtype=torch.int32)
        ).flatten(1)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
        self.seq_lens_list = seq_lens
        self.num_query = num_query
        total_q = sum(num_query)
        self.q = torch.randn(total_q, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
        loc = [0, *itertools.accumulate(num_query)]
        self.query_start_loc = torch.tensor(loc, dtype=torch.int32, device="cuda")
        self.query_start_loc_list = loc


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def torch_backend():
    from infer_core.builtin.attention_torch import TorchAttentionBackend

    return TorchAttentionBackend.__new__(TorchAttentionBackend)  # forward needs no context


def torch_metadata(cells: PagedCells) -> BatchMetadata:
    """The torch backend's view of a cell (256-token pages); new K/V go to pages no request reads."""
    seq_lens_cpu = torch.tensor(cells.seq_lens_list, dtype=torch.int32)
    loc_cpu = torch.tensor(cells.query_start_loc_list, dtype=torch.int32)
    return BatchMetadata(
        num_reqs=len(cells.seq_lens_list),
        num_tokens=int(loc_cpu[-1]),
        num_decode_only=sum(1 for n in cells.num_query if n == 1),
        max_query_len=max(cells.num_query),
        max_seq_len=max(cells.seq_lens_list),
        block_size=PAGE,
        query_start_loc=cells.query_start_loc,
        seq_lens=cells.seq_lens,
        block_tables=cells.block_table,
        slot_mapping=cells.spare_slots,
        query_start_loc_cpu=loc_cpu,
        seq_lens_cpu=seq_lens_cpu,
    )


def time_torch_backend(cells: PagedCells, record) -> None:
    backend, md = torch_backend(), torch_metadata(cells)
    layer = AttentionLayer(0, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, SCALE)
    kv_new = torch.zeros(cells.q.shape[0], NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    holder = {}

    def torch_fn():
        holder["out"] = backend.forward(layer, cells.q, kv_new, kv_new, cells.kv_cache, md)

    torch_fn()
    record("torch", PAGE, torch_fn, holder["out"])


def run_decode(batch: int, context: int, copy_bw: float, num_sms: int) -> list[dict]:
    cells = PagedCells(batch, [context] * batch, [1] * batch)
    bytes_read = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * 2 + cells.q.numel() * 2
    tiles = decode_tiles(HEAD_DIM)
    splits = choose_num_splits(batch, NUM_KV_HEADS, context, num_sms, tiles.block_n)
    scratch = SplitScratch.allocate(batch, NUM_HEADS, splits, HEAD_DIM, "cuda")
    base = {"kind": "decode", "batch": batch, "context": context, "tokens": batch * context}
    rows, outputs = [], {}

    def record(system: str, block_size: int, fn, out, **extra):
        ms = bench_ms(fn)
        gbs = bytes_read / (ms * 1e-3) / GB
        if batch * context < GRAPH_BELOW_TOKENS and system != "torch":  # host launch cost shows in small cells
            extra["graph_time_us"] = round(graph_ms(fn) * 1e3, 2)
        rows.append(
            {
                **base,
                "system": system,
                "block_size": block_size,
                "time_us": round(ms * 1e3, 2),
                "gb_s": round(gbs, 1),
                "copy_bw_share": round(gbs * GB / copy_bw, 3),
                **extra,
            }
        )
        outputs[(system, block_size)] = out

    for block_size, cache, table in (
        (PAGE, cells.kv_cache, cells.block_table),
        (16, cells.kv_cache_16, cells.block_table_16),
    ):
        out = torch.empty_like(cells.q)

        def ours(cache=cache, table=table, out=out):
            decode_attention(
                cells.q, cache, table, cells.seq_lens, out, scale=SCALE, num_splits=splits, tiles=tiles, scratch=scratch
            )

        record("triton", block_size, ours, out, num_splits=splits)
    if flash_attn_with_kvcache is not None:
        q4 = cells.q.unsqueeze(1)
        holder = {}

        def flash():
            holder["out"] = flash_attn_with_kvcache(
                q4,
                cells.kv_cache[0],
                cells.kv_cache[1],
                cache_seqlens=cells.seq_lens,
                block_table=cells.block_table,
                softmax_scale=SCALE,
                causal=True,
            )

        flash()
        record("flash-attn", PAGE, flash, holder["out"].squeeze(1))
    if batch * context <= TORCH_MAX_TOKENS:
        time_torch_backend(cells, record)
    add_agreement(rows, outputs)
    return rows


def add_agreement(rows: list[dict], outputs: dict) -> None:
    """Every system read the same inputs: record how far each output is from flash-attn's."""
    reference = outputs.get(("flash-attn", PAGE))
    if reference is None:
        return
    for row in rows:
        if row["system"] != "flash-attn":
            row["rel_err_vs_flash"] = round(rel_err(outputs[(row["system"], row["block_size"])], reference), 5)


def prefill_flops(cells: PagedCells) -> float:
    total = 0
    for n, s in zip(cells.num_query, cells.seq_lens_list):
        context = s - n
        total += n * context + n * (n + 1) // 2  # keys each query sees
    return 4.0 * NUM_HEADS * HEAD_DIM * total


def run_prefill(batch: int, query_len: int, prefix: int) -> list[dict]:
    cells = PagedCells(batch, [prefix + query_len] * batch, [query_len] * batch, seed=1)
    flops = prefill_flops(cells)
    base = {"kind": "prefill", "batch": batch, "query_len": query_len, "cached_prefix": prefix}
    rows, outputs = [], {}

    def record(system, block_size, fn, out):
        ms = bench_ms(fn)
        rows.append(
            {
                **base,
                "system": system,
                "block_size": block_size,
                "time_us": round(ms * 1e3, 2),
                "tflop_s": round(flops / (ms * 1e-3) / 1e12, 1),
            }
        )
        outputs[(system, block_size)] = out

    for block_size, cache, table in (
        (PAGE, cells.kv_cache, cells.block_table),
        (16, cells.kv_cache_16, cells.block_table_16),
    ):
        out = torch.empty_like(cells.q)

        def ours(cache=cache, table=table, out=out, tiles=prefill_tiles(HEAD_DIM, block_size)):
            prefill_attention(
                cells.q,
                cache,
                table,
                cells.seq_lens,
                cells.query_start_loc,
                out,
                scale=SCALE,
                first_req=0,
                num_reqs=batch,
                max_query_len=query_len,
                tiles=tiles,
            )

        record("triton", block_size, ours, out)
    if flash_attn_varlen_func is not None:
        cu_k = torch.tensor([0, *itertools.accumulate(cells.seq_lens_list)], dtype=torch.int32, device="cuda")
        holder = {}

        def flash():
            holder["out"] = flash_attn_varlen_func(
                cells.q,
                cells.kv_cache[0],
                cells.kv_cache[1],
                cu_seqlens_q=cells.query_start_loc,
                cu_seqlens_k=cu_k,
                max_seqlen_q=query_len,
                max_seqlen_k=prefix + query_len,
                softmax_scale=SCALE,
                causal=True,
                block_table=cells.block_table,
            )

        flash()
        record("flash-attn", PAGE, flash, holder["out"])
    time_torch_backend(cells, record)
    add_agreement(rows, outputs)
    return rows


def judge(rows: list[dict], copy_bw: float) -> list[dict]:
    """Ratio to flash-attn per cell, and whether each target of the issue holds."""
    flash = {
        (r["kind"], r["batch"], r.get("context"), r.get("cached_prefix")): r
        for r in rows
        if r["system"] == "flash-attn"
    }
    for r in rows:
        if r["system"] != "triton":
            continue
        peer = flash.get((r["kind"], r["batch"], r.get("context"), r.get("cached_prefix")))
        if peer is None:
            continue
        r["speed_vs_flash"] = round(peer["time_us"] / r["time_us"], 3)
        if "graph_time_us" in r and "graph_time_us" in peer:
            r["graph_speed_vs_flash"] = round(peer["graph_time_us"] / r["graph_time_us"], 3)
        if r["kind"] == "decode" and r["tokens"] >= 1 << 16:
            r["target"] = "speed >= 0.9x flash and >= 70% of copy bandwidth"
            r["target_met"] = r["speed_vs_flash"] >= 0.9 and r["copy_bw_share"] >= 0.7
        elif r["kind"] == "prefill":
            r["target"] = "speed >= 0.7x flash"
            r["target_met"] = r["speed_vs_flash"] >= 0.7
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the result JSON (default benchmarks/results)"
    )
    parser.add_argument("--quick", action="store_true", help="a few cells only (smoke run)")
    parser.add_argument("--sweep", action="store_true", help="print tile/split variants first (tuning)")
    parser.add_argument("--probe", action="store_true", help="print small decode cells eager vs CUDA graph first")
    parser.add_argument(
        "--merge", action="store_true", help="print split-K decode with the merge in one launch vs two, then exit"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/attention.py needs a CUDA device")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.merge or args.probe or args.sweep:
        from benchmarks import attention_tuning

        if args.merge:
            attention_tuning.probe_merge(num_sms)
            return
        if args.probe:
            attention_tuning.probe_small_decode()
        if args.sweep:
            attention_tuning.sweep(num_sms)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth: {copy_bw / GB:.0f} GB/s", flush=True)
    rows: list[dict] = []
    batches, contexts = ((1, 64), (2048, 8192)) if args.quick else (DECODE_BATCHES, DECODE_CONTEXTS)
    for batch, context in itertools.product(batches, contexts):
        cell = run_decode(batch, context, copy_bw, num_sms)
        rows += cell
        print(
            "  ".join(
                f"decode b={batch} ctx={context} {r['system']}/{r['block_size']}: {r['time_us']}us "
                f"{r['gb_s']}GB/s" + (f" (graph {r['graph_time_us']}us)" if "graph_time_us" in r else "")
                for r in cell
            ),
            flush=True,
        )
        torch.cuda.empty_cache()
    for prefix in (0, 1024):
        cell = run_prefill(8, 2048, prefix)
        rows += cell
        print(
            "  ".join(
                f"prefill prefix={prefix} {r['system']}/{r['block_size']}: {r['time_us']}us {r['tflop_s']}TF/s"
                for r in cell
            ),
            flush=True,
        )
    rows = judge(rows, copy_bw)
    targets = [r for r in rows if "target_met" in r]
    settings = {
        "num_heads": NUM_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "dtype": "bfloat16",
        "decode_batches": list(batches),
        "decode_contexts": list(contexts),
        "prefill": "8 x 2048, prefix 0/1024",
        "copy_bandwidth_gb_s": round(copy_bw / GB, 1),
        "num_sms": num_sms,
        "timing": "triton.testing.do_bench median, L2 flushed before each run (eager launches); "
        "graph_time_us: one CUDA-graph replay, median of 50, L2 flushed, for decode cells under 64k tokens",
        "decode_tiles": str(decode_tiles(HEAD_DIM)),
        "prefill_tiles": {page: str(prefill_tiles(HEAD_DIM, page)) for page in (PAGE, 16)},
        "versions": versions("triton", "flash-attn", "infer-attention-triton"),
        "targets_met": f"{sum(r['target_met'] for r in targets)}/{len(targets)}",
    }
    path = write_result("attention", settings, rows, args.out)
    print(f"targets met: {settings['targets_met']}; wrote {path}")
    for r in targets:
        if not r["target_met"]:
            print(
                f"  missed: {r['kind']} b={r['batch']} ctx={r.get('context')} prefix={r.get('cached_prefix')} "
                f"page {r['block_size']}: {r['speed_vs_flash']}x flash, {r.get('copy_bw_share')} of copy bw"
            )


if __name__ == "__main__":
    main()
