"""Issue 27 probe (from ../ep-attention-splits-2026-11-28/): the triton decode attention at Qwen3-30B-A3B's shapes on one
GPU (32 query / 4 KV heads) and one EP=2 rank (16 / 2), batch 64-256, contexts uniform in [CTX_LO, CTX_HI) (env),
split counts 1 / 2 / 4 / 8; CUDA-graph replays after L2 is filled with clean lines. One line per cell."""
import json, os, sys
import torch
from benchmarks.timing import graph_ms
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.tiles import choose_num_splits, decode_tiles
from infer_core.layers.fused.gemv_tiles import num_sms

HEAD_DIM, PAGE = 128, 16
rows = []
LO, HI = int(os.environ.get("CTX_LO", 300)), int(os.environ.get("CTX_HI", 1800))
for batch in (64, 128, 256):
    gen = torch.Generator().manual_seed(batch)
    seq = torch.randint(LO, HI, (batch,), generator=gen, dtype=torch.int32)
    pages = (seq + PAGE - 1) // PAGE
    for heads, kv_heads in ((32, 4), (16, 2)):
        num_blocks = int(pages.sum())
        cache = torch.randn(2, num_blocks, PAGE, kv_heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        perm = torch.randperm(num_blocks, generator=gen).int()
        table = torch.zeros(batch, int(pages.max()), dtype=torch.int32)
        used = 0
        for i, n in enumerate(pages.tolist()):
            table[i, :n] = perm[used:used + n]; used += n
        table, seq_d = table.cuda(), seq.cuda()
        order = torch.argsort(seq, descending=True).int().cuda()
        q = torch.randn(batch, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        tiles = decode_tiles(HEAD_DIM)
        chosen = choose_num_splits(batch, kv_heads, 2048, num_sms(torch.device("cuda")), tiles.block_n)
        ref = None
        for splits in (1, 2, 4, 8):
            scratch = SplitScratch.allocate(batch, heads, splits, HEAD_DIM, "cuda") if splits > 1 else None
            out = torch.empty_like(q)
            fn = lambda: decode_attention(q, cache, table, seq_d, out, scale=HEAD_DIM**-0.5, num_splits=splits,
                                          tiles=tiles, scratch=scratch, req_order=order)
            us = graph_ms(fn, l2_flush="read") * 1e3
            fn(); torch.cuda.synchronize()
            ref = out.clone() if ref is None else ref
            err = float((out.float() - ref.float()).abs().max())
            row = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "splits": splits, "chosen": chosen,
                   "us": round(us, 2), "max_abs_diff_vs_1": err, "kv_mb": round(2 * int(seq.sum()) * kv_heads * HEAD_DIM * 2 / 1e6, 1)}
            rows.append(row); print(json.dumps(row), flush=True)
out_dir = os.environ.get("OUT", ".")
json.dump(rows, open(os.path.join(out_dir, f"decode-splits-{LO}-{HI}.json"), "w"), indent=1)
