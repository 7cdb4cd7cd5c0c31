"""Split a bf16 CPU decode step at 32 rows (SmolLM2) by wrapping the heavy calls with wall-clock timers."""
import time, collections, torch
from infer_core import LLM, SamplingParams
from infer_core.layers import cpu_matmul, cpu_attention, cpu_elementwise, cpu_activation
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(mod, name, label):
    fn = getattr(mod, name)
    def timed(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k); acc[label] += time.perf_counter() - t; cnt[label] += 1; return r
    setattr(mod, name, timed)
import infer_core.layers.unquantized as uq, infer_core.builtin.attention_torch as at, infer_core.layers.norm as nm, infer_core.layers.activation as ac, infer_core.layers.rotary as ro
for m in (uq, cpu_matmul): 
    if hasattr(m, "packed_linear"): pass
wrap(cpu_matmul, "packed_linear", "gemm")
wrap(cpu_attention, "decode_attention", "attention")
wrap(cpu_elementwise, "add_rms_norm", "norm")
wrap(cpu_elementwise, "rotary_inplace", "rotary")
wrap(cpu_activation, "silu_and_mul", "silu")
llm = LLM("/work/research/smollm2-st", device="cpu", dtype="bfloat16")
prompts = [[1 + (i * 7 + j) % 4000 for j in range(40 + i)] for i in range(32)]
llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
eng = llm.engine
for i, p in enumerate(prompts):
    eng.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))
eng.step()  # prefill
for _ in range(5): eng.step()
acc.clear(); cnt.clear()
steps = 40
t = time.perf_counter()
for _ in range(steps): eng.step()
wall = time.perf_counter() - t
print(f"decode step at 32 rows: {1e3*wall/steps:.2f} ms")
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"  {k:10} {1e3*v/steps:7.2f} ms/step  ({cnt[k]//steps} calls)")
print(f"  other      {1e3*(wall-sum(acc.values()))/steps:7.2f} ms/step")
while eng.has_unfinished_requests(): eng.step()
llm.shutdown()
