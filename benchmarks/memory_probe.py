"""Transient GPU memory of the forward pass and the sampler at the shapes the KV sizing profiles.

Qwen3-0.6B-shaped dummy weights (bf16) on the torch attention backend: one 7,937-token prompt,
256 x 32 tokens, one long prompt next to 255 one-token requests, the [256, vocab] sampler with
top-k, top-p, penalties and logprobs, and a 2,048-token chunk after 6,000 cached tokens.

    python3 -m benchmarks.memory_probe        (on a CUDA machine)
"""
import json, tempfile, pathlib, torch
import tests.test_gpu as t  # the published Qwen3-0.6B shape
from infer_core import LLM, SamplingParams
from infer_core.interfaces import NewRequestData, SchedulerOutput
from infer_core.runner.inputs import build_step_inputs
from infer_core.runner.sampling_inputs import build_sampling_batch
from infer_core.layers.sampler import sample
d = pathlib.Path(tempfile.mkdtemp()); (d / "config.json").write_text(json.dumps(t.QWEN3_0_6B))
llm = LLM(str(d), load_format="dummy", max_model_len=8192, kv_cache_gb=4)
r = llm.engine.executor.worker.runner
GiB = 2**30
def peak(label, fn):
    torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn(); torch.cuda.synchronize()
    print(f"{label:<40} transient peak {(torch.cuda.max_memory_allocated() - base) / GiB:6.2f} GiB")
    return out
params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1, logprobs=20)
def step(lens, p):
    so = SchedulerOutput(); nb = 0
    for i, n in enumerate(lens):
        k = -(-n // 16); so.new_requests.append(NewRequestData(f"p{i}", [1] * n, n, p, list(range(nb, nb + k)), 0)); nb += k
        so.num_scheduled_tokens[f"p{i}"] = n
    return so
with torch.inference_mode():
    for lens in ([7937], [32] * 256, [7937] + [1] * 255):
        so = step(lens, SamplingParams(temperature=0))
        r.requests.clear()
        from infer_core.runner.state import apply_scheduler_output
        apply_scheduler_output(r.requests, so)
        inp = build_step_inputs(so, r.requests, 16, r.device)
        hidden = peak(f"forward {len(lens)} reqs {sum(lens)} tok", lambda: r.model(inp.input_ids, inp.positions, r.kv_caches, inp.metadata))
        logits = peak("lm head", lambda: r.model.compute_logits(hidden[inp.logits_indices]))
    states = [r.requests[rid] for rid in inp.request_ids]
    for st in states: st.sampling_params = params
    batch = peak("sampling batch build", lambda: build_sampling_batch(states, 151936, (), r.device, r.generator))
    peak("sample heavy [256, V]", lambda: sample(logits, batch))
    # a chunk of 2048 queries after 6000 cached tokens (masked path)
    so = step([8048], SamplingParams(temperature=0)); r.requests.clear(); apply_scheduler_output(r.requests, so)
    r.requests["p0"].num_computed_tokens = 6000
    so.num_scheduled_tokens["p0"] = 2048
    inp = build_step_inputs(so, r.requests, 16, r.device)
    peak("forward chunk 2048 after 6000 cached", lambda: r.model(inp.input_ids, inp.positions, r.kv_caches, inp.metadata))
