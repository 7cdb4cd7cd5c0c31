"""Two launches of a large-batch MoE decode step that an expert-parallel rank does not halve, swept one GPU:

- the Triton decode attention at batch 64 / 128, 4 KV heads (Qwen3-30B-A3B on one GPU) and 2 (its share on each
  of two ranks), 8 query heads a KV head, head_dim 128, contexts drawn from 100-1,100 tokens (the nano-vllm
  workload a few steps past its prefills), at 1, 2, 4 and 8 splits, beside the split count ``choose_num_splits``
  gives;
- the expert-grouping launch (``fused/moe_align.py``) at 128 tokens x top-8 over 128 experts (one GPU) and over
  64 (an EP=2 rank, half the entries another rank's), checked against ``align_by_expert``.

Each row is a CUDA-graph replay (``benchmarks.timing.graph_ms``, L2 emptied by a read before each), the median
microseconds. Printed and written as JSON: ``python -m benchmarks.decode_step_sweep --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from benchmarks.timing import graph_ms
from infer_core.layers.fused.moe_align import moe_align
from infer_core.layers.moe.align import align_by_expert
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.tiles import choose_num_splits, decode_tiles

HEAD_DIM, GROUP, PAGE, MAX_LEN = 128, 8, 256, 4096


def attention_rows(batch: int, num_kv_heads: int, num_sms: int) -> list[dict]:
    rng = random.Random(batch * 10 + num_kv_heads)
    seq_lens = [rng.randint(100, 1100) for _ in range(batch)]
    pages = [-(-s // PAGE) for s in seq_lens]
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(2, sum(pages) + 1, PAGE, num_kv_heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                     generator=gen)
    order = torch.randperm(sum(pages), device="cuda", generator=gen).to(torch.int32)
    tables = torch.zeros(batch, -(-MAX_LEN // PAGE), dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(pages):
        tables[i, :n] = order[used:used + n]
        used += n
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    req_order = torch.argsort(lens, descending=True, stable=True).to(torch.int32)
    q = torch.randn(batch, num_kv_heads * GROUP, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.empty_like(q)
    tiles = decode_tiles(HEAD_DIM)
    built = choose_num_splits(batch, num_kv_heads, MAX_LEN, num_sms, tiles.block_n)
    kv_bytes = sum(seq_lens) * num_kv_heads * HEAD_DIM * 2 * 2
    rows = []
    for splits in (1, 2, 4, 8):
        scratch = SplitScratch.allocate(batch, q.shape[1], splits, HEAD_DIM, "cuda") if splits > 1 else None

        def run(splits=splits, scratch=scratch):
            decode_attention(q, kv, tables, lens, out, scale=HEAD_DIM ** -0.5, num_splits=splits, tiles=tiles,
                             scratch=scratch, req_order=req_order)

        us = graph_ms(run, l2_flush="read") * 1e3
        rows.append({"kernel": "decode_attention", "batch": batch, "num_kv_heads": num_kv_heads, "splits": splits,
                     "chosen": splits == built, "us": round(us, 2), "kv_tb_s": round(kv_bytes / us / 1e6, 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def align_rows(num_tokens: int, top_k: int, num_experts: int, local_experts: int) -> list[dict]:
    """``local_experts < num_experts``: ids of other ranks' experts arrive as ``local_experts`` (left out)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.rand(num_tokens, num_experts, device="cuda", generator=gen).topk(top_k, dim=1).indices
    ids = torch.where(ids < local_experts, ids, local_experts).to(torch.int32)
    block_m = 16
    reference = align_by_expert(ids, local_experts, block_m)
    got = moe_align(ids, local_experts, block_m)
    same = (torch.equal(got.sorted_ids, reference.sorted_ids) and torch.equal(got.num_padded, reference.num_padded)
            and torch.equal(got.expert_ids, reference.expert_ids))
    us = graph_ms(lambda: moe_align(ids, local_experts, block_m), l2_flush="read") * 1e3
    row = {"kernel": "moe_align", "entries": ids.numel(), "experts": local_experts, "us": round(us, 2),
           "matches_torch": same}
    print(json.dumps(row), flush=True)
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for batch in (64, 128):
        for kv_heads in (4, 2):
            rows += attention_rows(batch, kv_heads, num_sms)
    rows += align_rows(128, 8, 128, 128)
    rows += align_rows(128, 8, 128, 64)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "decode-step-sweep.json"
        path.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
