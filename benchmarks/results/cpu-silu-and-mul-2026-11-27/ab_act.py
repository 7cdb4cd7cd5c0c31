import sys, time, random, statistics
sys.path.insert(0, "/work/main")
import torch
from infer_core import LLM, SamplingParams
from infer_core.layers.activation import SiluAndMul
dtype = sys.argv[1]
llm = LLM("/work/research/smollm2-st", dtype=dtype, device="cpu")
model = llm.engine.executor.worker.runner.model
acts = [m for m in model.modules() if isinstance(m, SiluAndMul)]
kernel = acts[0].cpu_kernel
print(len(acts), kernel)
rng = random.Random(0)
def batch(n, L): return [[rng.randrange(100, 40000) for _ in range(L)] for _ in range(n)]
pre = SamplingParams(max_tokens=1, temperature=0)
dec = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
res = {"C": {"prefill": [], "decode": []}, "torch": {"prefill": [], "decode": []}}
llm.generate(batch(4, 512), pre, use_tqdm=False)
for i in range(6):
    for mode in (("C", "torch") if i % 2 == 0 else ("torch", "C")):
        for m in acts: m.cpu_kernel = kernel if mode == "C" else None
        t = time.perf_counter(); llm.generate(batch(4, 512), pre, use_tqdm=False); res[mode]["prefill"].append(time.perf_counter() - t)
        t = time.perf_counter(); llm.generate(batch(32, 16), dec, use_tqdm=False); res[mode]["decode"].append(time.perf_counter() - t)
for mode, r in res.items():
    print(dtype, mode, "prefill 4x512 s median", round(statistics.median(r["prefill"]), 3), [round(x, 3) for x in r["prefill"]],
          "| 32x48 decode s median", round(statistics.median(r["decode"]), 3), [round(x, 3) for x in r["decode"]])
llm.shutdown()
