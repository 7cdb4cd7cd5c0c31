import torch, time
from infer_core.layers import cpu_activation as ca, cpu_elementwise as ce
def bench(f, reps=30):
    for _ in range(3): f()
    ts=[]
    for _ in range(reps):
        s=time.perf_counter(); f(); ts.append(time.perf_counter()-s)
    ts.sort(); return round(ts[len(ts)//2]*1e3,3)
torch.set_num_threads(1)
libs = {"vec": (ca.load(), ce.load()), "scalar": (ca.load(True), ce.load(True))}
for rnd in range(2):
  for dt in (torch.bfloat16, torch.float32):
    x=torch.randn(2048,3072,dtype=dt)
    r=torch.randn(2048,576,dtype=dt); h=torch.randn(2048,576,dtype=dt); w=torch.randn(576,dtype=dt)
    qkv=torch.randn(2048,960,dtype=dt); q=qkv[:,:576].view(2048,9,64); k=qkv[:,576:768].view(2048,3,64)
    pos=torch.arange(2048,dtype=torch.int32); cs=torch.randn(8192,64)
    for name,(A,E) in libs.items():
        print(rnd, dt, name, "silu", bench(lambda: ca.silu_and_mul(A,x)), "norm", bench(lambda: ce.add_rms_norm(E,h,r,w,1e-5)),
          "rotary", bench(lambda: ce.rotary_inplace(E,pos,q,k,cs,64)))
