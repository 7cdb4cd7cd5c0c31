import torch, time
torch.manual_seed(0)
def t(m,k,n,dt=torch.bfloat16,reps=20):
    a=torch.randn(m,k,dtype=dt); b=torch.randn(n,k,dtype=dt)
    for _ in range(3): torch.nn.functional.linear(a,b)
    ts=[]
    for _ in range(reps):
        s=time.perf_counter(); torch.nn.functional.linear(a,b); ts.append(time.perf_counter()-s)
    ts.sort(); med=ts[len(ts)//2]
    print(f"{m}x{k}x{n} {dt}: {med*1e3:.2f} ms, {2*m*k*n/med/1e12:.2f} TFLOP/s")
print(torch.get_num_threads())
for m,k,n in [(2048,576,3072),(2048,576,960),(2048,1536,576),(2048,576,576),(4096,4096,4096),(512,576,3072)]:
    t(m,k,n)
