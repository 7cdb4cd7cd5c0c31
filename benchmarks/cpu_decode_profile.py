"""Where a CPU decode step goes: the chat workload's 32 rows, step by step, then a window under torch.profiler.

Every row decodes from the same step on (the 32 prompts are one prefill step), so each step after it is a
32-row decode step; the script times each step's ``execute_async`` (on the CPU it computes the step before it
returns), then profiles ``--profile-steps`` steps with shapes recorded, each module's forward named by a
``record_function`` range (``Module:<class>``) and the attention backend's by ``Attention:backend``. Writes the
profiler's tables (by op, by op and input shape, by range) and a JSON of the step times to ``--out``.

    python -m benchmarks.cpu_decode_profile --model /work/research/smollm2-st --dtype bfloat16 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def _name_modules(model: torch.nn.Module) -> None:
    """A record_function range around every module's forward (only while the profiler runs)."""
    from infer_core.profiling import step_range

    for module in model.modules():
        label = f"Module:{type(module).__name__}"

        def pre(mod, args, label=label):
            ctx = step_range(label)
            ctx.__enter__()
            mod._profile_ranges = getattr(mod, "_profile_ranges", []) + [ctx]

        def post(mod, args, out):
            mod._profile_ranges.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--profile-steps", type=int, default=8)
    parser.add_argument("--profile-at", type=int, default=24, help="decode steps before the profiled window")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-module-ranges", action="store_true", help="time only (no hooks)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from infer_core import LLM, SamplingParams
    from infer_core.bench.chat_workload import chat_workload

    workload = chat_workload(args.model, 32, args.new_tokens)
    llm = LLM(args.model, dtype=args.dtype, load_format="auto", max_model_len=1024)
    runner = llm.engine.executor.worker.runner
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate([workload.prompts[0]], SamplingParams(temperature=0, max_tokens=4),
                 use_tqdm=False)  # warm-up
    if not args.no_module_ranges:
        _name_modules(runner.model)
    if True:
        backend = runner.attention
        forward = backend.forward

        def named_forward(*a, **k):
            with record_function("Attention:backend"):
                return forward(*a, **k)

        backend.forward = named_forward

    times: list[tuple[int, float]] = []
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=not args.no_module_ranges)
    execute = runner.execute_async
    state = {"step": 0}

    def timed(output):
        step = state["step"]
        rows = len(output.num_scheduled_tokens)
        if args.profile_steps and step == args.profile_at + 1:
            prof.__enter__()
        start = time.perf_counter()
        with record_function("infer.bench.step") if step > args.profile_at else _null():
            result = execute(output)
        times.append((rows, time.perf_counter() - start))
        if args.profile_steps and step == args.profile_at + args.profile_steps:
            prof.__exit__(None, None, None)
        state["step"] = step + 1
        return result

    runner.execute_async = timed
    start = time.perf_counter()
    llm.generate(list(workload.prompts), params, use_tqdm=False)
    wall = time.perf_counter() - start
    decode = [t for rows, t in times[1:] if rows == 32]
    summary = {"model": args.model, "dtype": args.dtype, "threads": torch.get_num_threads(),
               "wall_s": wall, "prefill_ms": times[0][1] * 1e3,
               "decode_step_ms": [round(t * 1e3, 2) for t in decode],
               "decode_mean_ms": statistics.mean(decode) * 1e3,
               "profiled_steps": args.profile_steps, "loadavg": os.getloadavg()}
    (args.out / f"steps-{args.dtype}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "decode_step_ms"}))
    print("decode steps (ms):", summary["decode_step_ms"])
    if not args.profile_steps:
        llm.shutdown()
        return
    averages = prof.key_averages()
    (args.out / f"ops-{args.dtype}.txt").write_text(averages.table(sort_by="self_cpu_time_total", row_limit=60))
    (args.out / f"ops-by-shape-{args.dtype}.txt").write_text(
        prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=80,
                                                           max_name_column_width=40, max_shapes_column_width=90))
    (args.out / f"ranges-{args.dtype}.txt").write_text(averages.table(sort_by="cpu_time_total", row_limit=40))
    print(averages.table(sort_by="cpu_time_total", row_limit=45))
    llm.shutdown()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
