"""Probe (issue 26): the Triton decode kernel over an FP8 cache on the two decode cells of
``benchmarks.kv_fp8_decode_sweep`` (offline-8b: 256 requests of 200-2,000 tokens, 32 / 8 heads; long-0.6b: 32 x
8,000, 16 / 8), 16-token pages, at the tiles and the split count the backend picks and at 1 / 2 / 4 / 8 splits; bf16
at its default beside it. Run in each tree (this one, then base) in one call: it imports whatever
``infer_attention_triton`` the PYTHONPATH gives. Prints a JSON line per cell and setting; max_diff against the
first FP8 setting's output of the cell.

    PYTHONPATH=... python benchmarks/results/fp8-decode-v-convert-probe-2026-11-28/decode_ab.py LABEL
"""

from __future__ import annotations

import json
import sys

import torch

from benchmarks.kv_fp8_decode_sweep import CELLS, HEAD_DIM, cell
from benchmarks.timing import bench_ms
from infer_attention_triton import tiles as tiles_module
from infer_attention_triton.decode import SplitScratch, decode_attention
from infer_attention_triton.tiles import choose_num_splits, decode_tiles


def main() -> None:
    label = sys.argv[1]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_sm = getattr(tiles_module, "FP8_PROGRAMS_PER_SM", 2)
    for name, (batch, num_heads, num_kv_heads, lens) in CELLS.items():
        q, bf16, fp8, _, table16, seq_lens = cell(batch, num_heads, num_kv_heads, lens)
        kv_bytes = int(seq_lens.sum()) * num_kv_heads * HEAD_DIM * 2
        max_len = int(seq_lens.max())
        ref = None
        for kind, cache in (("bf16", bf16), ("fp8", fp8)):
            t = decode_tiles(HEAD_DIM, kv_fp8=kind == "fp8")
            chosen = choose_num_splits(batch, num_kv_heads, max_len, num_sms, t.block_n,
                                       *((per_sm,) if kind == "fp8" and per_sm != 2 else ()))
            for splits in ([chosen] if kind == "bf16" else [chosen, 1, 2, 4, 8]):
                scratch = SplitScratch.allocate(batch, num_heads, max(splits, 2), HEAD_DIM, "cuda")
                view = cache.view(2, -1, 16, num_kv_heads, HEAD_DIM)
                out = torch.empty_like(q)

                def fn():
                    decode_attention(q, view, table16, seq_lens, out, scale=HEAD_DIM**-0.5, num_splits=splits,
                                     tiles=t, scratch=scratch)

                fn()
                ms = bench_ms(fn)
                if kind == "fp8" and ref is None:
                    ref = out.float().clone()
                diff = float((out.float() - ref).abs().max()) if kind == "fp8" else None
                print(json.dumps({"tree": label, "cell": name, "kv": kind, "splits": splits, "chosen": splits == chosen,
                                  "tiles": [t.block_n, t.num_warps, t.num_stages], "us": round(ms * 1e3, 1),
                                  "gb_s": round(kv_bytes * cache.element_size() / (ms * 1e-3) / 1e9, 1),
                                  "max_diff_vs_chosen": diff}), flush=True)


if __name__ == "__main__":
    main()
