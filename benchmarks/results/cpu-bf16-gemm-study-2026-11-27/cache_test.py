"""Does the FX graph cache hit across processes for a frozen max-autotune graph? (small 2-layer chain)"""
import os, time, torch
import torch._inductor.config as ic
from common import *
from torch._dynamo.utils import counters
ic.freezing = True
ic.cpp.weight_prepack = os.environ.get("PREPACK", "1") == "1"
ic.max_autotune_gemm_backends = os.environ.get("BACKENDS", "CPP,ATEN")
W, lm = make_weights(L=2, seed=int(os.environ.get("SEED", 0)))
mod = ChainModule(W, lm).eval(); x = torch.randn(32, H).bfloat16()
with torch.no_grad():
    t0 = time.perf_counter(); y = torch.compile(mod, mode="max-autotune")(x); tc = time.perf_counter() - t0
    ref = chain(x.float(), [{k: w.float() for k, w in d.items()} for d in W], lm.float(), F.linear)
print(f"BACKENDS={ic.max_autotune_gemm_backends} SEED={os.environ.get('SEED',0)} compile {tc:.1f}s relerr {((y.float()-ref).abs().max()/ref.abs().max()).item():.2e}",
      {k: v for k, v in counters["inductor"].items() if "cache" in k or "cpp_templated" in k or "extern" in k})
