"""Read bandwidth of this machine's two cores (torch reductions over 270 MB of bfloat16) and one LM-head-sized
F.linear at 32 rows; what was run inline for the README beside it."""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
x = torch.randn(135_000_000, dtype=torch.float32).to(torch.bfloat16)  # 270 MB
for name, f in [("sum", lambda: x.sum()), ("max", lambda: x.max()), ("clone", lambda: x.clone())]:
    f(); ts = []
    for _ in range(5):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    print(name, f"{min(ts)*1e3:.1f} ms -> {x.numel()*2/min(ts)/1e9:.1f} GB/s read")
a = torch.randn(32, 576).to(torch.bfloat16)
W = torch.randn(49152, 576).to(torch.bfloat16)
F.linear(a, W); ts = []
for _ in range(10):
    t = time.perf_counter(); F.linear(a, W); ts.append(time.perf_counter() - t)
print("linear lm_head", f"{min(ts)*1e3:.2f} ms -> {W.numel()*2/min(ts)/1e9:.1f} GB/s")
