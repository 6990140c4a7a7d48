"""PyTorch's times for the kernels `wgtrain bench` measures, same shapes, same GPU.

Run on the GPU machine: python3 scripts/torch_kernels.py > torch_kernels.json
Prints a JSON list of {kernel, dtype, shape, median_us, gflops, gbps}. TF32 off.
"""
import json

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"


def bench(fn, repeats=10, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def row(kernel, dtype, shape, us, flops=0.0, nbytes=0.0):
    return {"kernel": kernel, "dtype": dtype, "shape": shape, "median_us": us,
            "gflops": flops / us / 1e3 if flops else None, "gbps": nbytes / us / 1e3 if nbytes else None}


out = []
n = 1 << 28
x = torch.randn(n, device=dev)
y = torch.empty_like(x)
out.append(row("copy", "f32", [n], bench(lambda: y.copy_(x)), nbytes=8.0 * n))
del x, y
n = 1 << 26
a, b = torch.randn(n, device=dev), torch.randn(n, device=dev)
c = torch.empty_like(a)
out.append(row("add", "f32", [n], bench(lambda: torch.add(a, b, out=c)), flops=n, nbytes=12.0 * n))
del a, b, c
for name, dt, size in [("matmul_f32", torch.float32, 4096), ("matmul_f16", torch.float16, 4096), ("matmul_f16", torch.float16, 8192)]:
    a = torch.randn(size, size, device=dev, dtype=dt)
    b = torch.randn(size, size, device=dev, dtype=dt)
    out.append(row(name, str(dt).replace("torch.float", "f"), [size] * 3, bench(lambda: a @ b), flops=2.0 * size ** 3))
    del a, b
s = torch.randn(8 * 12 * 1024, 1024, device=dev)
out.append(row("softmax", "f32", list(s.shape), bench(lambda: torch.softmax(s, -1)), nbytes=8.0 * s.numel()))
del s
ln = torch.nn.LayerNorm(768, device=dev)
h = torch.randn(8 * 1024, 768, device=dev)
with torch.no_grad():
    out.append(row("layernorm", "f32", list(h.shape), bench(lambda: ln(h)), nbytes=8.0 * h.numel()))
logits = torch.randn(8 * 1024, 50257, device=dev, requires_grad=True)
targets = torch.randint(0, 50257, (8 * 1024,), device=dev)


def ce():
    logits.grad = None
    torch.nn.functional.cross_entropy(logits, targets).backward()


out.append(row("cross_entropy_fwd_bwd", "f32", list(logits.shape), bench(ce), nbytes=8.0 * logits.numel()))
del logits
q, k, v = (torch.randn(8, 12, 1024, 64, device=dev) for _ in range(3))
with torch.no_grad():
    sdpa = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    out.append(row("attention_fwd", "f32", [8, 12, 1024, 64], sdpa, flops=4.0 * 8 * 12 * 1024 * 1024 * 64))
p = torch.nn.Parameter(torch.randn(124_439_808, device=dev))
p.grad = torch.randn_like(p)
opt = torch.optim.AdamW([p], fused=True)
out.append(row("adamw", "f32", [p.numel()], bench(opt.step), nbytes=28.0 * p.numel()))
print(json.dumps(out, indent=1))
