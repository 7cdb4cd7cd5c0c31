import time, cProfile, pstats, torch
from infer_core import LLM, SamplingParams
llm = LLM("/work/research/smollm2-st", device="cpu", dtype="bfloat16")
prompts = [[1 + (i * 7 + j) % 4000 for j in range(40 + i)] for i in range(32)]
llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
eng = llm.engine
for i, p in enumerate(prompts):
    eng.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))
eng.step()
for _ in range(5): eng.step()
steps = 30
t = time.perf_counter()
for _ in range(steps): eng.step()
print(f"plain: {1e3*(time.perf_counter()-t)/steps:.2f} ms/step")
pr = cProfile.Profile(); pr.enable()
t = time.perf_counter()
for _ in range(steps): eng.step()
pr.disable()
print(f"profiled: {1e3*(time.perf_counter()-t)/steps:.2f} ms/step")
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(30)
while eng.has_unfinished_requests(): eng.step()
