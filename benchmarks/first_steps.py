"""Where a batch-1 request's time to first token goes: its first steps under ``torch.profiler``.

The latency benchmark's ``--profile`` window starts after the prefill; this one starts with it.
A warm-up request runs first (untimed, unprofiled: kernel compiles), then one request of
``--prompt-len`` tokens is added and its first ``--steps`` engine steps (the prefill, then decode
steps: with overlapped steps the prefill's token is read by the step after it) are profiled.
Prints each step's host time, the named host ranges in it, its kernel launches and GPU busy time;
``--out DIR`` also keeps the Chrome trace and the printed figures as JSON. ``--cprofile`` runs the
same steps under cProfile instead and prints the Python functions with the most own time, for the
first step and for the others (where the host's time goes between kernel launches).

    python -m benchmarks.first_steps --model Qwen3-0.6B --attention triton --out /tmp/traces
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from infer_core.bench.offline_common import resolve_model
from infer_core.bench.workload import latency_prompt

STEP_RANGE = "first_steps.step"


def _per_step(events: list[dict]) -> list[dict]:
    """Per profiled step: host ms, named ``infer.*`` ranges, kernels launched and GPU busy ms."""
    steps = sorted((e for e in events if e.get("name") == STEP_RANGE and e.get("ph") == "X"), key=lambda e: e["ts"])
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    ranges = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("infer.")
              and e.get("cat") == "user_annotation"]
    rows = []
    for i, step in enumerate(steps):
        start, end = step["ts"], step["ts"] + step["dur"]
        # a step's kernels run up to the next step's start (overlapped: they may end after its host part)
        stop = steps[i + 1]["ts"] if i + 1 < len(steps) else float("inf")
        mine = [k for k in kernels if start <= k["ts"] < stop]
        named: dict[str, float] = {}
        for r in ranges:
            if start <= r["ts"] < end:
                named[r["name"]] = round(named.get(r["name"], 0.0) + r["dur"] / 1e3, 3)
        rows.append({"step": i, "host_ms": round(step["dur"] / 1e3, 3), "ranges_ms": named,
                     "kernels": len(mine), "gpu_busy_ms": round(sum(k["dur"] for k in mine) / 1e3, 3)})
    return rows


def _cprofile_steps(engine, num_steps: int) -> None:
    """The first step, then the rest, each under its own cProfile: top functions by own time."""
    import cProfile
    import io
    import pstats

    first, rest = cProfile.Profile(), cProfile.Profile()
    for i in range(num_steps):
        profiler = first if i == 0 else rest
        profiler.enable()
        engine.step()
        profiler.disable()
    torch.cuda.synchronize()
    for label, profiler in (("first step", first), (f"steps 1-{num_steps - 1}", rest)):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(35)
        print(f"--- cProfile, {label} ---\n" + text.getvalue(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-0.6B")
    parser.add_argument("--attention", default="triton")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=1,
                        help="requests added at once: the first step prefills them all (a batch's prefill step)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--cprofile", action="store_true", help="cProfile the steps instead (Python time)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the trace and a JSON of the figures")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("first_steps profiles CUDA kernels: run it on a GPU machine")

    from torch.profiler import ProfilerActivity, profile, record_function

    from infer_core import LLM, SamplingParams

    with tempfile.TemporaryDirectory(prefix="first-steps-") as scratch:
        folder, label = resolve_model(args.model, Path(scratch))
        llm = LLM(folder, load_format="dummy", dtype="bfloat16", attention=args.attention, max_model_len=4096, seed=0)
        engine = llm.engine
        prompt = latency_prompt(args.prompt_len, engine.config.model.vocab_size)
        params = SamplingParams(temperature=0, max_tokens=args.steps + 4, ignore_eos=True)
        llm.generate([prompt], params, use_tqdm=False)  # warm-up: compiles, first-use costs
        for round_ in range(3):  # unprofiled: the launching call's host time, and until the GPU is done
            plain = [f"plain-{round_}-{i}" for i in range(args.num_prompts)]
            for i, request_id in enumerate(plain):
                engine.add_request(request_id, [(t + 7 + i + 100 * round_) % 10000 for t in prompt], params)
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.step()
            launched = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
            print(json.dumps({"unprofiled_prefill_step": round_, "tokens": args.num_prompts * args.prompt_len,
                              "launch_ms": round((launched - start) * 1e3, 3),
                              "until_gpu_done_ms": round((done - start) * 1e3, 3)}), flush=True)
            for request_id in plain:
                engine.abort(request_id)
            while engine.has_unfinished_requests():  # the step still in flight
                engine.step()
        ids = [f"first-steps-{i}" for i in range(args.num_prompts)]
        for i, request_id in enumerate(ids):  # shifted token ids: no prefix-cache hit
            engine.add_request(request_id, [(t + 1 + i) % 10000 for t in prompt], params)
        torch.cuda.synchronize()
        if args.cprofile:
            _cprofile_steps(engine, args.steps)
            for request_id in ids:
                engine.abort(request_id)
            return
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                with record_function(STEP_RANGE):
                    engine.step()
            torch.cuda.synchronize()
        for request_id in ids:
            engine.abort(request_id)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
        trace = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(trace))
        rows = _per_step(json.loads(trace.read_text())["traceEvents"])
        for row in rows:
            print(json.dumps(row), flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"first-steps-{label}-{args.attention}.trace.json").write_text(trace.read_text())
            settings = {"model": label, "attention": args.attention, "prompt_len": args.prompt_len,
                        "num_prompts": args.num_prompts,
                        "steps": args.steps, "load_format": "dummy", "dtype": "bfloat16"}
            print("wrote", write_result("first-steps", settings, rows, args.out), flush=True)


if __name__ == "__main__":
    main()
