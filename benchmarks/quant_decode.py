"""Batch-1 decode speed and weight memory of W8A8 (``infer-quant-w8a8``) against the unquantized model.

One process, one engine at a time (each shut down and its memory returned before the next): dummy weights of
``--model`` (Qwen3-8B by default) in bfloat16, then quantized online to int8 and to FP8. For each: the bytes
of the model's parameters and buffers (weights and their scales; the KV cache apart), and decode tok/s at
batch 1: a ``--prompt-len`` prompt, ``--new-tokens`` greedy tokens, ``--repeats`` timed runs after a warm-up,
decode time being the whole request's less its time to first token (a 1-token request's).

    python -m benchmarks.quant_decode --out benchmarks/results          # on an H100, plugin installed
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from infer_core.bench.offline_common import resolve_model
from infer_core.bench.workload import latency_prompt


def weight_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}  # tied weights once
    return sum(t.numel() * t.element_size() for t in tensors.values())


def timed(llm, prompt: list[int], new_tokens: int) -> float:
    from infer_core import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(folder: str, quantization: str, args: argparse.Namespace) -> dict:
    from infer_core import LLM

    llm = LLM(folder, load_format="dummy", dtype="bfloat16", quantization=quantization, attention=args.attention,
              max_model_len=args.prompt_len + args.new_tokens + 16, max_num_seqs=8, seed=0)
    try:
        model = llm.engine.executor.worker.runner.model
        prompt = latency_prompt(args.prompt_len, llm.engine.config.model.vocab_size)
        timed(llm, prompt, args.new_tokens)  # warm-up: compiles, first-use costs
        decode_s = []
        for _ in range(args.repeats):
            first = timed(llm, prompt, 1)
            whole = timed(llm, prompt, args.new_tokens)
            decode_s.append(whole - first)
        decode = statistics.median(decode_s)
        row = {"quantization": quantization, "weight_bytes": weight_bytes(model),
               "decode_tok_s": round((args.new_tokens - 1) / decode, 2),
               "decode_ms_per_token": round(1e3 * decode / (args.new_tokens - 1), 4),
               "decode_s_runs": [round(s, 4) for s in decode_s]}
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--attention", default="triton")
    parser.add_argument("--quantizations", nargs="+", default=["none", "int8", "fp8"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON of the figures")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("quant_decode times CUDA decode steps: run it on a GPU machine")
    rows = []
    with tempfile.TemporaryDirectory(prefix="quant-decode-") as scratch:
        folder, label = resolve_model(args.model, Path(scratch))
        for quantization in args.quantizations:
            row = measure(folder, quantization, args)
            rows.append(row)
            print(row, flush=True)
    base = next((r for r in rows if r["quantization"] == "none"), None)
    for row in rows:
        if base is not None:
            row["speedup_vs_none"] = round(row["decode_tok_s"] / base["decode_tok_s"], 3)
            row["weight_fraction_of_none"] = round(row["weight_bytes"] / base["weight_bytes"], 4)
        print(f"{row['quantization']:>6}: {row['decode_tok_s']:8.1f} tok/s  {row['weight_bytes'] / 2**30:6.2f} GiB  "
              f"x{row.get('speedup_vs_none', 1.0):.3f}  {row.get('weight_fraction_of_none', 1.0):.3f} of the weights",
              flush=True)
    if args.out is not None:
        settings = {"model": label, "attention": args.attention, "prompt_len": args.prompt_len,
                    "new_tokens": args.new_tokens, "repeats": args.repeats, "load_format": "dummy",
                    "dtype": "bfloat16"}
        print("wrote", write_result("quant-decode", settings, rows, args.out), flush=True)


if __name__ == "__main__":
    main()
