"""One bfloat16 prefill step of 4 x 512-token prompts (2,048 tokens, the serving benchmark's c=32 steps), median of
5 after a warm-up, on whichever tree is first on PYTHONPATH; run alternately for the trees compared."""
import random, statistics, sys, time
import torch
from infer_core import LLM, SamplingParams

dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
llm = LLM("/work/research/smollm2-st", device="cpu", dtype=dtype)
rng = random.Random(0)
sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
batch = lambda: [[rng.randrange(100, 40000) for _ in range(512)] for _ in range(4)]
llm.generate(batch(), sp, use_tqdm=False)
ts = []
for _ in range(5):
    t = time.perf_counter(); llm.generate(batch(), sp, use_tqdm=False); ts.append(time.perf_counter() - t)
print(f"{sys.argv[2] if len(sys.argv) > 2 else ''} {dtype} 4 x 512-token prefill: median {statistics.median(ts):.3f} s "
      f"runs {[round(x, 3) for x in ts]}", flush=True)
llm.shutdown()
