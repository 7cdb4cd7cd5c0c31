"""FP8 KV cache against the model's dtype: long-context offline throughput and the KV capacity the engine logs.

The workload of issue 26: ``--num-prompts`` requests (32) of ``--prompt-len`` random token ids (7,900), each
generating ``--new-tokens`` (256) greedy tokens with ``ignore_eos``, all submitted at once; decode then reads
about 8k tokens of KV per request per step, so the bytes of the cache set the pace. One process, one engine
at a time (each shut down and its memory returned before the next): dummy weights of ``--model``
(Qwen3-0.6B) in bfloat16, for each row of ``--rows`` (``kv_cache_dtype:attention``; attention ``auto`` is
the engine's own choice). Each engine first runs a warm-up batch of the timed one's shape (compiles).
The KV capacity is the engine's log line ("KV cache: N blocks of B tokens = T tokens"), sized by the same
memory profile for every row.

    python -m benchmarks.kv_fp8 --out benchmarks/results          # on a GPU
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import re
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from infer_core.bench.offline_common import resolve_model

CAPACITY = re.compile(r"KV cache: (\d+) blocks of (\d+) tokens = (\d+) tokens")


class CapacityLog(logging.Handler):
    """Keeps the tokens of the last "KV cache: ..." line the engine logs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.tokens: int | None = None
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        found = CAPACITY.search(record.getMessage())
        if found:
            self.tokens, self.line = int(found.group(3)), record.getMessage()


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def run(llm, batch: list[list[int]], new_tokens: int) -> tuple[float, int]:
    from infer_core import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outputs)


def measure(folder: str, kv_cache_dtype: str, attention: str, args: argparse.Namespace) -> dict:
    from infer_core import LLM

    log = CapacityLog()
    core_logger = logging.getLogger("infer_core.engine.core")
    core_logger.addHandler(log)
    core_logger.setLevel(logging.INFO)
    llm = LLM(folder, load_format="dummy", dtype="bfloat16", kv_cache_dtype=kv_cache_dtype,
              attention=None if attention == "auto" else attention,
              max_model_len=args.prompt_len + args.new_tokens + 16, seed=0)
    try:
        vocab = llm.engine.config.model.vocab_size
        # warm-up: the timed batch's shapes (Triton compiles a kernel variant per split count and tile; a smaller
        # batch left some of those compiles inside the timed run: 8.09 s against 4.01 warm, H100 call P7)
        run(llm, prompts(args.num_prompts, args.prompt_len, vocab, seed=1), 16)
        wall, generated = run(llm, prompts(args.num_prompts, args.prompt_len, vocab, seed=0), args.new_tokens)
        row = {"kv_cache_dtype": kv_cache_dtype, "attention": llm.engine.config.implementations["attention"],
               "kv_capacity_tokens": log.tokens, "kv_log_line": log.line, "wall_s": round(wall, 4),
               "generated_tokens": generated, "output_tok_s": round(generated / wall, 1),
               "total_tok_s": round((generated + args.num_prompts * args.prompt_len) / wall, 1)}
    finally:
        core_logger.removeHandler(log)
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-0.6B")
    parser.add_argument("--rows", nargs="+", default=["auto:triton", "fp8:triton", "auto:auto"],
                        help="kv_cache_dtype:attention per engine; the first is the baseline of the ratios")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=7900)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON of the figures")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kv_fp8 sizes the KV cache by CUDA memory: run it on a GPU machine")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kv-fp8-") as scratch:
        folder, label = resolve_model(args.model, Path(scratch))
        for spec in args.rows:
            kv_cache_dtype, _, attention = spec.partition(":")
            row = measure(folder, kv_cache_dtype, attention or "auto", args)
            rows.append(row)
            print(row, flush=True)
    base = rows[0]
    for row in rows:
        row["speedup_vs_first"] = round(base["wall_s"] / row["wall_s"], 3)
        row["kv_capacity_vs_first"] = round(row["kv_capacity_tokens"] / base["kv_capacity_tokens"], 3)
        print(f"{row['kv_cache_dtype']:>5} {row['attention']:>7}: {row['wall_s']:7.2f} s  "
              f"{row['output_tok_s']:8.1f} output tok/s  KV {row['kv_capacity_tokens']:>9} tokens  "
              f"x{row['speedup_vs_first']:.3f} speed  x{row['kv_capacity_vs_first']:.3f} capacity", flush=True)
    if args.out is not None:
        settings = {"model": label, "rows": args.rows, "num_prompts": args.num_prompts, "prompt_len": args.prompt_len,
                    "new_tokens": args.new_tokens, "load_format": "dummy", "dtype": "bfloat16", "greedy": True}
        print("wrote", write_result("kv-fp8", settings, rows, args.out), flush=True)


if __name__ == "__main__":
    main()
