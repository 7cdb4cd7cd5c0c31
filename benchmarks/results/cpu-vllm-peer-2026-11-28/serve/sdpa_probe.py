import time, torch, torch.nn.functional as F
torch.manual_seed(0)
for L in (512, 2048):
    q, k, v = (torch.randn(1, 9, L, 64).bfloat16() for _ in range(3))
    def flash(): return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.full((L, L), float("-inf")).triu(1)
    def math():
        s = torch.matmul(q, k.transpose(-1, -2)).float() * 0.125 + mask
        return torch.matmul(s.softmax(-1).bfloat16(), v)
    def math_bf16():
        s = torch.baddbmm(mask.bfloat16().expand(9, L, L), q[0], k[0].transpose(-1, -2), alpha=0.125)
        return torch.matmul(s.softmax(-1), v[0])
    ref = flash().float()
    for f in (flash, math, math_bf16):
        out = f().float().reshape(ref.shape)
        err = (out - ref).abs().max().item()
        f(); t = time.perf_counter()
        for _ in range(10): f()
        print(L, f.__name__, round((time.perf_counter() - t) / 10 * 1e3, 2), "ms", "err", round(err, 4))
