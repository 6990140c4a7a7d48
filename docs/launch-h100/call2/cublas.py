import json, torch
torch.backends.cuda.matmul.allow_tf32 = False
out = []
for (m,k,n) in [(128,64,128),(128,256,128),(1408,256,768)]:
    a = torch.randn(m,k,device="cuda",dtype=torch.float16); b = torch.randn(k,n,device="cuda",dtype=torch.float16)
    for L in (1,10,100):
        for _ in range(20): a @ b
        torch.cuda.synchronize(); ts = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(L): a @ b
            e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3 / L)
        ts.sort(); us = ts[len(ts)//2]
        out.append({"shape":[m,k,n],"launches":L,"median_us":us})
print(json.dumps(out, indent=1))
