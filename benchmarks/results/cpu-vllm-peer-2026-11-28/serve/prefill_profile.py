import random, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from infer_core import LLM, SamplingParams
dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
llm = LLM("/work/research/smollm2-st", device="cpu", dtype=dtype)
rng = random.Random(0)
sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
def batch():
    return [[rng.randrange(100, 40000) for _ in range(512)] for _ in range(4)]
llm.generate(batch(), sp, use_tqdm=False)  # warm-up
ts = []
for _ in range(3):
    t = time.perf_counter(); llm.generate(batch(), sp, use_tqdm=False); ts.append(time.perf_counter() - t)
print(dtype, "4 x 512-token prefill, s:", [round(x, 3) for x in ts])
from benchmarks.cpu_decode_profile import _name_modules
_name_modules(llm.engine.executor.worker.runner.model)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    llm.generate(batch(), sp, use_tqdm=False)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
