"""Issue 30 study (final run): bf16 decode-step GEMMs of SmolLM2-135M on CPU, 2 threads, candidates interleaved in ONE process.

Step = the 30 layers' qkv(960x576) / o(576x576) / gate_up(3072x576) / down(576x1536) GEMMs with distinct weights (212 MB)
+ lm_head (49152x576, 57 MB) = 269 MB of bf16 weights read once per step.
Candidates:
  packed_h32      current engine path: mkldnn._reorder_linear_weight(w, 32) + mkldnn._linear_pointwise
  packed_h8       same oneDNN layout as h32 (hints 8/16/64/128 all give AB16b32a2b), a distinct copy: NOISE CONTROL
  packed_h1       hint 1 (layout AB16b64a2b)
  F.linear        unpacked weights
  step_ind_cpp    the whole step (121 independent GEMMs, returns all outputs) in ONE torch.compile graph,
                  freezing + mode=max-autotune, backends CPP,ATEN (Inductor C++ GEMM template, AMX micro-kernel), dynamic M
  step_ind_aten   same graph, freezing + default mode (Inductor emits mkldnn._linear_pointwise on prepacked weights), dynamic M
  chain_eager_h32 decode-like dependent chain (rmsnorm, residual, silu*mul between GEMMs) in eager with packed_h32
  chain_ind_cpp   that chain compiled in one graph, freezing + max-autotune (CPP,ATEN), dynamic M
  chain_ind_aten  that chain compiled in one graph, freezing + default mode, dynamic M
  sum_*           2-thread read-bandwidth probes on a 512 MB tensor (bf16 sum is conversion-bound; the f32 view is the better ceiling)
Columns: median/min ms over ROUNDS rounds (order rotated and reversed every round), GB/s = weight bytes / time, and
'ratio' = median over rounds of t(packed_h32)/t(candidate) in the same round (paired; >1 = faster than the current path;
chain_* are paired with chain_eager_h32).
Env: MS (default 32,16,8,1), ROUNDS (default 60), IND=0 skips the compiled candidates.
Run:  TORCHINDUCTOR_CACHE_DIR=/tmp/gemm30/icache_final TORCHINDUCTOR_COMPILE_THREADS=1 python bench_final.py
"""
import os, time, statistics
import torch, torch.nn as nn, torch.nn.functional as F
import torch._inductor.config as ic
from common import *

ic.freezing = True
MS = [int(m) for m in os.environ.get("MS", "32,16,8,1").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", 60)); IND = os.environ.get("IND", "1") == "1"
torch.manual_seed(0)
print(f"torch {torch.__version__} threads={torch.get_num_threads()} MS={MS} rounds={ROUNDS}", flush=True)
W, lm = make_weights()
layer_bytes = sum(w.numel() * 2 for d in W for w in d.values()); lm_bytes = lm.numel() * 2; step_bytes = layer_bytes + lm_bytes
print(f"layer weights {layer_bytes/1e6:.1f} MB, lm_head {lm_bytes/1e6:.1f} MB, step {step_bytes/1e6:.1f} MB", flush=True)

def lp(x, p): return torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
def packset(h): return [{k: torch.ops.mkldnn._reorder_linear_weight(w, h) for k, w in d.items()} for d in W], torch.ops.mkldnn._reorder_linear_weight(lm, h)
C = {"packed_h32": (*packset(32), lp), "packed_h8": (*packset(8), lp), "packed_h1": (*packset(1), lp), "F.linear": (W, lm, F.linear)}
def rel(a, b): return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
def eager_step(x, h, Pw, Plm, f):
    outs = []
    for d in Pw:
        outs += [f(x, d["qkv"]), f(x, d["o"]), f(x, d["gate_up"]), f(h, d["down"])]
    outs.append(f(x, Plm)); return outs

class StepModule(nn.Module):
    """All 121 GEMMs of a step, independent (inputs x [M,576], h [M,1536]), in one graph."""
    def __init__(self):
        super().__init__(); self.ws = nn.ParameterList([nn.Parameter(d[k], requires_grad=False) for d in W for k in SHAPES])
        self.lm = nn.Parameter(lm, requires_grad=False)
    def forward(self, x, h):
        ws = list(self.ws); outs = []
        for i in range(0, len(ws), 4):
            outs += [F.linear(x, ws[i]), F.linear(x, ws[i + 1]), F.linear(x, ws[i + 2]), F.linear(h, ws[i + 3])]
        outs.append(F.linear(x, self.lm)); return outs

xs = torch.randn(32, H).bfloat16(); hs = torch.randn(32, I).bfloat16()
with torch.no_grad():
    ref_step = {m: eager_step(xs[:m].float(), hs[:m].float(), [{k: w.float() for k, w in d.items()} for d in W], lm.float(), F.linear) for m in (1, 32)}
    def check_step(name, fn):
        e = max(rel(a, b) for m in (1, 32) for a, b in zip(fn(xs[:m], hs[:m]), ref_step[m]))
        print(f"check {name}: max rel err over all 121 GEMM outputs (M=1,32) vs fp32 = {e:.2e} {'OK' if e < 1e-2 else 'FAIL'}", flush=True)
    for n, (Pw, Plm, f) in C.items(): check_step(n, lambda x, h, Pw=Pw, Plm=Plm, f=f: eager_step(x, h, Pw, Plm, f))
    compiled, compile_log = {}, []
    if IND:
        for name, Mod, mode in (("step_ind_cpp", StepModule, "max-autotune"), ("step_ind_aten", StepModule, "default"),
                                ("chain_ind_cpp", lambda: ChainModule(W, lm), "max-autotune"), ("chain_ind_aten", lambda: ChainModule(W, lm), "default")):
            ic.max_autotune_gemm_backends = "CPP,ATEN"
            c = torch.compile(Mod().eval(), mode=mode, dynamic=True)
            args = (xs, hs) if name.startswith("step") else (xs,)
            t0 = time.perf_counter(); c(*args); dt = time.perf_counter() - t0
            compile_log.append(f"{name}: compile + first call {dt:.1f}s (mode={mode}, dynamic M)"); print(compile_log[-1], flush=True)
            compiled[name] = c
            if name.startswith("step"): check_step(name, c)
            else:
                for m in (1, 32):
                    ref = chain(xs[:m].float(), [{k: w.float() for k, w in d.items()} for d in W], lm.float(), F.linear)
                    e_eag = rel(chain(xs[:m], C["packed_h32"][0], C["packed_h32"][1], lp), ref)
                    print(f"check {name} M={m}: rel err vs fp32 chain {rel(c(xs[:m]), ref):.2e} (eager packed bf16 chain: {e_eag:.2e})", flush=True)

    big = torch.ones(256 * 1024 * 1024, dtype=torch.bfloat16)
    summary = []
    for M in MS:
        x = torch.randn(M, H).bfloat16(); h = torch.randn(M, I).bfloat16()
        fns = {n: (lambda Pw=Pw, Plm=Plm, f=f: eager_step(x, h, Pw, Plm, f)) for n, (Pw, Plm, f) in C.items()}
        for n in ("step_ind_cpp", "step_ind_aten"):
            if n in compiled: fns[n] = (lambda c=compiled[n]: c(x, h))
        fns["chain_eager_h32"] = lambda: chain(x, C["packed_h32"][0], C["packed_h32"][1], lp)
        for n in ("chain_ind_cpp", "chain_ind_aten"):
            if n in compiled: fns[n] = (lambda c=compiled[n]: c(x))
        fns["sum_bf16_512MB"] = lambda: big.sum()
        fns["sum_f32view_512MB"] = lambda: big.view(torch.float32).sum()
        for f in fns.values(): f(); f(); f()
        t = {n: [] for n in fns}; names = list(fns)
        for r in range(ROUNDS):
            order = names[r % len(names):] + names[:r % len(names)]
            if r % 2: order = order[::-1]
            for n in order:
                t0 = time.perf_counter(); fns[n](); t[n].append(time.perf_counter() - t0)
        print(f"\n== M={M}: {ROUNDS} interleaved rounds", flush=True)
        print(f"{'candidate':18s} {'median ms':>9s} {'min ms':>7s} {'GB/s med':>8s} {'GB/s min':>8s} {'ratio':>6s}")
        for n in names:
            b = 2 ** 29 if n.startswith("sum") else step_bytes
            med, mn = statistics.median(t[n]), min(t[n])
            base = "chain_eager_h32" if n.startswith("chain") else "packed_h32"
            ratio = statistics.median(a / c for a, c in zip(t[base], t[n])) if not n.startswith("sum") else float("nan")
            line = f"{n:18s} {med*1e3:9.2f} {mn*1e3:7.2f} {b/med/1e9:8.2f} {b/mn/1e9:8.2f} {ratio:6.3f}"
            print(line, flush=True); summary.append(f"M={M:2d} {line}")
    print("\n".join(["", "SUMMARY"] + compile_log + summary))
