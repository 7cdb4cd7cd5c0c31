import time, torch, sys
sys.path.insert(0, "/work/main")
import torch.nn.functional as F
from infer_core.layers import cpu_activation
lib = cpu_activation.load()
for dtype in (torch.bfloat16, torch.float32):
    x = torch.randn(2048, 3072).to(dtype)
    def ours(): return cpu_activation.silu_and_mul(lib, x)
    def torch_ops(): return F.silu(x[:, :1536]) * x[:, 1536:]
    for f in (ours, torch_ops):
        f(); t = time.perf_counter()
        for _ in range(10): f()
        print(dtype, f.__name__, round((time.perf_counter() - t) / 10 * 1e3, 2), "ms")
