import torch, time
import torch.nn.functional as F
def bench(f, reps=20):
    for _ in range(3): f()
    ts=[]
    for _ in range(reps):
        s=time.perf_counter(); f(); ts.append(time.perf_counter()-s)
    ts.sort(); return ts[len(ts)//2]*1e3
for dt in (torch.bfloat16, torch.float32):
    q=torch.randn(1,9,512,64,dtype=dt); k=torch.randn(1,3,512,64,dtype=dt); v=torch.randn(1,3,512,64,dtype=dt)
    kr=k.repeat_interleave(3,1); vr=v.repeat_interleave(3,1)
    print(dt, "sdpa rep", bench(lambda: F.scaled_dot_product_attention(q,kr,vr,is_causal=True)))
    print(dt, "sdpa gqa", bench(lambda: F.scaled_dot_product_attention(q,k,v,is_causal=True,enable_gqa=True)))
    q4=torch.randn(4,9,512,64,dtype=dt); k4=torch.randn(4,3,512,64,dtype=dt); v4=torch.randn(4,3,512,64,dtype=dt)
    print(dt, "sdpa gqa batch4 /4", bench(lambda: F.scaled_dot_product_attention(q4,k4,v4,is_causal=True,enable_gqa=True))/4)
