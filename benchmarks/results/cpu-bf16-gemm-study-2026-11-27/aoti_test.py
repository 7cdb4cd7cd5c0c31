"""Startup route for the CPP-template GEMMs: AOTInductor package (built once, loaded at engine start).
 python aoti_test.py build  -> exports + compiles the 121-GEMM step (freezing, max-autotune CPP,ATEN, dynamic M) to step.pt2
 python aoti_test.py load   -> fresh process: load time, correctness, interleaved timing vs packed_h32 at M=32 and 8"""
import os, sys, time, statistics, torch, torch.nn as nn, torch.nn.functional as F
from common import *
W, lm = make_weights()
class StepModule(nn.Module):
    def __init__(self):
        super().__init__(); self.ws = nn.ParameterList([nn.Parameter(d[k], requires_grad=False) for d in W for k in SHAPES])
        self.lm = nn.Parameter(lm, requires_grad=False)
    def forward(self, x, h):
        ws = list(self.ws); outs = []
        for i in range(0, len(ws), 4):
            outs += [F.linear(x, ws[i]), F.linear(x, ws[i + 1]), F.linear(x, ws[i + 2]), F.linear(h, ws[i + 3])]
        outs.append(F.linear(x, self.lm)); return outs
PKG = "/tmp/gemm30/step.pt2"
with torch.no_grad():
    if sys.argv[1] == "build":
        t0 = time.perf_counter()
        Mdim = torch.export.Dim("M", min=1, max=64)
        ep = torch.export.export(StepModule().eval(), (torch.randn(32, H).bfloat16(), torch.randn(32, I).bfloat16()), dynamic_shapes=({0: Mdim}, {0: Mdim}))
        torch._inductor.aoti_compile_and_package(ep, package_path=PKG, inductor_configs={"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"})
        print(f"AOTI build {time.perf_counter()-t0:.1f}s, package {os.path.getsize(PKG)/1e6:.0f} MB", flush=True)
    else:
        t0 = time.perf_counter(); fn = torch._inductor.aoti_load_package(PKG); tl = time.perf_counter() - t0
        x = torch.randn(32, H).bfloat16(); h = torch.randn(32, I).bfloat16()
        t0 = time.perf_counter(); out = fn(x, h); tf = time.perf_counter() - t0
        refs = [F.linear(x.float(), d[k].float()) if k != "down" else F.linear(h.float(), d[k].float()) for d in W for k in SHAPES] + [F.linear(x.float(), lm.float())]
        e = max(((a.float() - b).abs().max() / b.abs().max()).item() for a, b in zip(out, refs))
        print(f"AOTI load {tl:.2f}s first call {tf:.2f}s max rel err {e:.2e}", flush=True)
        P = [{k: torch.ops.mkldnn._reorder_linear_weight(w, 32) for k, w in d.items()} for d in W]; Plm = torch.ops.mkldnn._reorder_linear_weight(lm, 32)
        lp = lambda a, p: torch.ops.mkldnn._linear_pointwise(a, p, None, "none", [], "")
        for M in (32, 8):
            xm, hm = x[:M].contiguous(), h[:M].contiguous()
            fns = {"packed_h32": lambda: [lp(xm, d[k]) if k != "down" else lp(hm, d[k]) for d in P for k in SHAPES] + [lp(xm, Plm)], "aoti_step": lambda: fn(xm, hm)}
            t = {n: [] for n in fns}
            for f in fns.values(): f(); f()
            for r in range(40):
                for n in (list(fns) if r % 2 else list(fns)[::-1]):
                    t0 = time.perf_counter(); fns[n](); t[n].append(time.perf_counter() - t0)
            ratio = statistics.median(a / b for a, b in zip(t["packed_h32"], t["aoti_step"]))
            print(f"M={M}: " + "  ".join(f"{n} med {statistics.median(v)*1e3:.2f} ms min {min(v)*1e3:.2f} ms" for n, v in t.items()) + f"  paired ratio h32/aoti {ratio:.3f}", flush=True)
