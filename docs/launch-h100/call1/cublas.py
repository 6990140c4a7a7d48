import json, torch
torch.backends.cuda.matmul.allow_tf32 = False
out = []
shapes = [(128,768,768),(2816,768,768),(5632,768,768),(8448,768,768),(8192,768,768),(16896,768,768),(8448,1536,768),(8448,3072,768),(4096,4096,4096)]
for (m,k,n) in shapes:
    a = torch.randn(m,k,device="cuda",dtype=torch.float16); b = torch.randn(k,n,device="cuda",dtype=torch.float16)
    for L in (1,10):
        for _ in range(20): a @ b
        torch.cuda.synchronize(); ts = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(L): a @ b
            e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3 / L)
        ts.sort(); us = ts[len(ts)//2]
        out.append({"shape":[m,k,n],"launches":L,"median_us":us,"tflops":2*m*n*k/us/1e6})
# GPT-2's dW of attn_proj as ours: X^T (a view) @ dY, f16 out.
x = torch.randn(8192,768,device="cuda",dtype=torch.float16); dy = torch.randn(8192,768,device="cuda",dtype=torch.float16)
for L in (1,10):
    torch.cuda.synchronize(); ts=[]
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(L): x.t() @ dy
        e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e)*1e3/L)
    ts.sort(); us=ts[len(ts)//2]
    out.append({"shape":"attn_proj.dw","launches":L,"median_us":us,"tflops":2*768*768*8192/us/1e6})
print(json.dumps(out, indent=1))
