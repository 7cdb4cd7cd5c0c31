import ctypes, time, torch, statistics
lib = ctypes.CDLL("/tmp/amx/f32k.so"); P, L = ctypes.c_void_p, ctypes.c_long
lib.f32_pack.argtypes = [P, P, L, L]; lib.f32_linear.argtypes = [P, L, P, P, P, L, L, L]
torch.manual_seed(0)
shapes = {"qkv": (960, 576, 30), "o": (576, 576, 30), "gate_up": (3072, 576, 30), "down": (576, 1536, 30)}
def pack(w):
    n, k = w.shape; out = torch.empty(-(-n // 32) * 32 * k); lib.f32_pack(w.data_ptr(), out.data_ptr(), n, k); return out
def lin(x, p, n):
    m, k = x.shape; y = torch.empty(m, n); lib.f32_linear(x.data_ptr(), x.stride(0), p.data_ptr(), None, y.data_ptr(), m, n, k); return y
ws = {n: [(torch.randn(a, b) * 0.05) for _ in range(c)] for n, (a, b, c) in shapes.items()}
one = {n: [torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in l] for n, l in ws.items()}
ours = {n: [pack(w) for w in l] for n, l in ws.items()}
for rows in (128, 512, 2048):
    xs = {n: torch.randn(rows, shapes[n][1]) for n in shapes}
    for n in shapes:
        ref = xs[n] @ ws[n][0].t(); got = lin(xs[n], ours[n][0], shapes[n][0])
        assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (n, (got-ref).abs().max())
    paths = {"flinear": lambda n, i: torch.nn.functional.linear(xs[n], ws[n][i]), "onednn": lambda n, i: torch.ops.mkldnn._linear_pointwise(xs[n], one[n][i], None, "none", [], ""),
             "ours": lambda n, i: lin(xs[n], ours[n][i], shapes[n][0])}
    t = {p: [] for p in paths}
    for _ in range(3):
        for p, f in paths.items():
            s = time.perf_counter()
            for n in shapes:
                for i in range(shapes[n][2]): f(n, i)
            t[p].append(time.perf_counter() - s)
    r = {p: round(statistics.median(v) * 1e3, 1) for p, v in t.items()}
    print(rows, r, "x%.2f" % (r["onednn"] / r["ours"]), flush=True)
