"""Probe (issue 26, long-context FP8 KV x1.3): where the 32 x 7,900-token workload's time goes, per row.

For each ``kv_cache_dtype:attention`` row: the engine warmed on the timed batch's shape (as ``benchmarks.kv_fp8``),
then the workload stepped by hand, each step's host wall time kept (the steps with prompt tokens are the
prefill phase); then two profiled windows of the same workload: steps 2-5 (prefill chunks) and 6 steps past
every prompt's prefill (decode of 32 rows at ~8k context), each with its top kernels.

    PYTHONPATH=$PWD python benchmarks/results/kv-fp8-long-context-h100-2026-11-28/lc_profile.py --out $OUT/x.json
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.kv_fp8 import prompts, run
from infer_core.bench.offline_common import resolve_model
from infer_core.bench.step_profile import profile_steps


def stepped(llm, batch, new_tokens):
    from infer_core import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for i, prompt in enumerate(batch):
        engine.add_request(f"s{i}", prompt, params)
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return time.perf_counter() - start, times


def window(llm, batch, skip, steps):
    from infer_core import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
    ids = [engine.add_request(f"p{i}", prompt, params) for i, prompt in enumerate(batch)]
    try:
        for _ in range(skip):
            engine.step()
        return profile_steps(engine.step, steps)
    finally:
        for i in ids:
            engine.abort(i)
        while engine.has_unfinished_requests():
            engine.step()


def main() -> None:
    from infer_core import LLM

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", nargs="+", default=["auto:auto", "fp8:triton", "auto:triton"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder, _ = resolve_model("Qwen3-0.6B", Path(scratch))
        for spec in args.rows:
            kv, _, attention = spec.partition(":")
            llm = LLM(folder, load_format="dummy", dtype="bfloat16", kv_cache_dtype=kv,
                      attention=None if attention == "auto" else attention, max_model_len=7900 + 256 + 16, seed=0)
            vocab = llm.engine.config.model.vocab_size
            run(llm, prompts(32, 7900, vocab, seed=1), 16)
            wall, times = stepped(llm, prompts(32, 7900, vocab, seed=0), 256)
            prefill_steps = -(-32 * 7900 // 8192)
            row = {"wall_s": wall, "steps": len(times), "first_steps_s": sum(times[:prefill_steps + 1]),
                   "rest_s": sum(times[prefill_steps + 1:]), "step_ms": [round(1e3 * t, 2) for t in times]}
            row["prefill_window"] = window(llm, prompts(32, 7900, vocab, seed=2), 2, 4)
            row["decode_window"] = window(llm, prompts(32, 7900, vocab, seed=3), prefill_steps + 4, 6)
            out[spec] = row
            print(f"{spec}: wall {wall:.3f} s, {len(times)} steps, first {prefill_steps + 1} steps "
                  f"{row['first_steps_s']:.3f} s, rest {row['rest_s']:.3f} s", flush=True)
            for name in ("prefill_window", "decode_window"):
                b = row[name]
                print(f"  {name}: wall {b['wall_ms_per_step']} ms/step, gpu busy {b['gpu_busy_ms_per_step']}", flush=True)
                for k in b["top_kernels"][:8]:
                    print(f"    {k['us_per_step']:10.1f} us  x{k['calls_per_step']:6.1f}  {k['name'][:110]}", flush=True)
            llm.shutdown()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
