import time, torch, torch.nn.functional as F
torch.manual_seed(0)
H, HK, D = 9, 3, 64
def sdpa(q, k, v):
    # q [T,H,D], k/v [S,HK,D]
    g = H // HK
    qq, kk, vv = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    kk, vv = kk.repeat_interleave(g, dim=1), vv.repeat_interleave(g, dim=1)
    return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=D**-0.5)[0].transpose(0, 1)
def bmm(q, k, v, chunk=512):
    T = q.shape[0]; S = k.shape[0]; g = H // HK
    kt = k.permute(1, 2, 0)  # [HK, D, S]
    vv = v.transpose(0, 1)  # [HK, S, D]
    out = torch.empty_like(q)
    for s0 in range(0, T, chunk):
        qc = q[s0:s0+chunk]  # [c, H, D]
        c = qc.shape[0]
        qg = qc.view(c, HK, g, D).permute(1, 2, 0, 3).reshape(HK, g * c, D)
        sc = torch.bmm(qg, kt).float() * D**-0.5  # [HK, g*c, S]
        pos = torch.arange(s0 + S - T, s0 + S - T + c)
        mask = torch.arange(S)[None, :] > pos[:, None]  # [c, S]
        sc.view(HK, g, c, S).masked_fill_(mask, float("-inf"))
        p = torch.softmax(sc, dim=-1).to(q.dtype)
        o = torch.bmm(p, vv)  # [HK, g*c, D]
        out[s0:s0+c] = o.view(HK, g, c, D).permute(2, 0, 1, 3).reshape(c, H, D)
    return out
for dtype in (torch.float32, torch.bfloat16):
    for T in (512, 2048):
        q = torch.randn(T, H, D).to(dtype); k = torch.randn(T, HK, D).to(dtype); v = torch.randn(T, HK, D).to(dtype)
        a = sdpa(q, k, v); b = bmm(q, k, v)
        err = ((a.float() - b.float()).abs().max() / a.float().abs().max()).item()
        for name, fn in (("sdpa", sdpa), ("bmm", bmm), ("sdpa", sdpa), ("bmm", bmm)):
            fn(q, k, v)
            t = time.perf_counter(); n = 0
            while time.perf_counter() - t < 1.0:
                fn(q, k, v); n += 1
            print(f"{dtype} T={T} {name}: {1e3*(time.perf_counter()-t)/n:.2f} ms  (rel diff {err:.1e})", flush=True)
