"""Issue 27 probe: where one GPU's and an EP=2 rank's steps go, in several windows of one run of nano-vllm's offline
workload (Qwen3-30B-A3B, dummy bf16): two prefill steps, then four decode steps each once the unfinished requests
first fall to 256 / 128 / 32 / 6. The engine as `infer bench throughput` starts it; the parallel strategy from the
environment (INFER_EXPERT_PARALLEL_SIZE). Prints each window's breakdown (40 kernels); JSON to $OUT/windows-<tag>.json.

    python ep_windows.py TAG

TRACE_DIR: keep the prefill window's Chrome trace there; PREFILL_ONLY=1: stop after that window.
"""
import json, os, sys, time
from pathlib import Path

from infer_core import SamplingParams
from infer_core.bench import engine_runs, step_profile
from infer_core.bench.offline_common import resolve_model
from infer_core.bench.workload import offline_workload

step_profile.NUM_TOP_KERNELS = 40
tag = sys.argv[1]
folder, _ = resolve_model("Qwen3-30B-A3B", Path("/tmp/ep-windows"))
settings = {"load_format": "dummy", "dtype": "bfloat16", "max_num_seqs": 256, "max_model_len": 4096, "seed": 0}
llm, row = engine_runs.start_engine(folder, settings)
engine = llm.engine
workload = offline_workload().head(256)
for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens)):
    engine.add_request(f"w{i}", prompt, SamplingParams(temperature=workload.temperature, ignore_eos=True, max_tokens=n))
windows = {}
remaining, step, todo = 256, 0, [("decode<=256", 256), ("decode<=128", 128), ("decode<=32", 32), ("decode<=6", 6)]
started = time.perf_counter()
while engine.has_unfinished_requests():
    if step == 2:
        trace = Path(os.environ["TRACE_DIR"]) / f"prefill-{tag}.json" if os.environ.get("TRACE_DIR") else None
        windows["prefill"] = step_profile.profile_steps(engine.step, 2, trace)
        step += 2
        if os.environ.get("PREFILL_ONLY"):
            break
        continue
    if step > 20 and todo and remaining <= todo[0][1]:
        name, _ = todo.pop(0)
        windows[name] = step_profile.profile_steps(engine.step, 4)
        windows[name]["remaining"] = remaining
        step += 4
        continue
    for out in engine.step():
        remaining -= int(out.finished)
    step += 1
for request_id in [f"w{i}" for i in range(256)]:
    engine.abort(request_id)
for name, b in windows.items():
    print(step_profile.format_breakdown(f"{tag} {name}", b), flush=True)
print(f"{tag}: {step} steps, {time.perf_counter() - started:.1f} s with the windows", flush=True)
json.dump({"row": row, "windows": windows}, open(os.path.join(os.environ.get("OUT", "."), f"windows-{tag}.json"), "w"),
          indent=1)
llm.shutdown()
