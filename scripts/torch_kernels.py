"""PyTorch's times for the kernels `wgtrain bench` measures, same shapes, same GPU,
including the GPT-2 step's rows (`gpt2.*`; f16 matmuls give f16 outputs here, f32 ours).

Run on the GPU machine: python3 scripts/torch_kernels.py > torch_kernels.json, then
`wgtrain bench --compare torch_kernels.json` prints each row's ratio.
Prints a JSON list of {kernel, dtype, shape, median_us, gflops, gbps}. TF32 off.
"""
import json
import sys

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"


def bench(fn, repeats=25, warmup=10):
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
del p, opt

# The GPT-2 step's own shapes (wgtrain's bench::gpt2).
B, T, C, NH, V = 8, 1024, 768, 12, 50257
R = B * T
for dt, name in [(torch.float32, "f32"), (torch.float16, "f16")]:
    for layer, k, n in [("qkv", C, 3 * C), ("attn_proj", C, C), ("fc", C, 4 * C), ("fc_proj", 4 * C, C)]:
        x = torch.randn(R, k, device=dev, dtype=dt)
        w = torch.randn(k, n, device=dev, dtype=dt)
        dy = torch.randn(R, n, device=dev, dtype=dt)
        fl = 2.0 * R * k * n
        out.append(row(f"gpt2.{layer}.fwd", name, [R, k, n], bench(lambda: x @ w), flops=fl))
        out.append(row(f"gpt2.{layer}.dx", name, [R, n, k], bench(lambda: dy @ w.t()), flops=fl))
        out.append(row(f"gpt2.{layer}.dw", name, [k, R, n], bench(lambda: x.t() @ dy), flops=fl))
        del x, w, dy
    q, k_, v = (torch.randn(B, NH, T, C // NH, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    g = torch.randn(B, NH, T, C // NH, device=dev, dtype=dt)

    def attn():
        q.grad = k_.grad = v.grad = None
        torch.nn.functional.scaled_dot_product_attention(q, k_, v, is_causal=True).backward(g)

    sdpa = row("gpt2.attention.fwd_bwd", name, [B, NH, T, C // NH], bench(attn),
               flops=0.5 * 3.5 * 4.0 * B * NH * T * T * (C // NH))
    out.append(sdpa)
    out.append(dict(sdpa, kernel="gpt2.flash_attention.fwd_bwd"))
    # The same forward and backward replayed from a CUDA graph: the GPU's time alone,
    # without the host's launches between kernels (which moved the row above by up to
    # 1.8x between machines); ours is timed on the GPU too.
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                attn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        q.grad = k_.grad = v.grad = None
        with torch.cuda.graph(graph):
            torch.nn.functional.scaled_dot_product_attention(q, k_, v, is_causal=True).backward(g)
        out.append(dict(sdpa, kernel="gpt2.flash_attention.fwd_bwd.graph", median_us=bench(graph.replay),
                        gflops=None))
        out[-1]["gflops"] = sdpa["gflops"] * sdpa["median_us"] / out[-1]["median_us"]
    except Exception as e:  # noqa: BLE001 - the row is an extra; say why it is missing
        print(f"no CUDA graph row for {name} attention: {e}", file=sys.stderr)
    del q, k_, v, g
ln = torch.nn.LayerNorm(C, device=dev)
h = torch.randn(R, C, device=dev)
with torch.no_grad():
    out.append(row("gpt2.layernorm.fwd", "f32", [R, C], bench(lambda: ln(h)), nbytes=8.0 * R * C))
hg = h.clone().requires_grad_(True)
y = ln(hg)
dy = torch.randn_like(y)
out.append(row("gpt2.layernorm.bwd", "f32", [R, C],
               bench(lambda: torch.autograd.grad(y, [hg, ln.weight, ln.bias], dy, retain_graph=True)), nbytes=12.0 * R * C))
a = torch.randn(R, 4 * C, device=dev)
with torch.no_grad():
    out.append(row("gpt2.gelu.fwd", "f32", [R, 4 * C],
                   bench(lambda: torch.nn.functional.gelu(a, approximate="tanh")), nbytes=8.0 * R * 4 * C))
ag = a.clone().requires_grad_(True)
ya = torch.nn.functional.gelu(ag, approximate="tanh")
da = torch.randn_like(ya)
out.append(row("gpt2.gelu.bwd", "f32", [R, 4 * C],
               bench(lambda: torch.autograd.grad(ya, ag, da, retain_graph=True)), nbytes=12.0 * R * 4 * C))
r1, r2 = torch.randn(R, C, device=dev), torch.randn(R, C, device=dev)
out.append(row("gpt2.residual_add", "f32", [R, C], bench(lambda: r1 + r2), nbytes=12.0 * R * C))
ids = torch.randint(0, V, (R,), device=dev)
dout = torch.randn(R, C, device=dev)
table = torch.zeros(V, C, device=dev)
out.append(row("gpt2.embedding.bwd", "f32", [R, V, C], bench(lambda: table.index_add_(0, ids, dout)), nbytes=12.0 * R * C))

# ResNet-50's convolutions (wgtrain's bench::resnet): cuDNN on channels_last, batch 128,
# the algorithm cuDNN's benchmark mode picks; f16 gradients come out in f16 here (f32 in
# ours). Shape: [N, H, W, C, K, R, S, stride].
torch.backends.cudnn.benchmark = True
F = torch.nn.functional
N = 128
for name, side, c, k, ks, stride, pad in [
    ("stem", 224, 3, 64, 7, 2, 3), ("layer1.conv2", 56, 64, 64, 3, 1, 1), ("layer1.conv3", 56, 64, 256, 1, 1, 0),
    ("layer2.conv2.s2", 56, 128, 128, 3, 2, 1), ("layer2.conv1", 28, 512, 128, 1, 1, 0),
    ("layer3.conv2", 14, 256, 256, 3, 1, 1), ("layer4.conv2", 7, 512, 512, 3, 1, 1),
    ("layer4.conv3", 7, 512, 2048, 1, 1, 0),
]:
    for dt, dn in [(torch.float32, "f32"), (torch.float16, "f16")]:
        x = torch.randn(N, c, side, side, device=dev, dtype=dt).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, ks, ks, device=dev, dtype=dt).to(memory_format=torch.channels_last)
        dy = torch.randn_like(F.conv2d(x, w, stride=stride, padding=pad))
        fl = 2.0 * dy.numel() * c * ks * ks
        shape = [N, side, side, c, k, ks, ks, stride]

        def grad(mask):
            return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, mask)

        out.append(row(f"resnet50.{name}.fwd", dn, shape, bench(lambda: F.conv2d(x, w, stride=stride, padding=pad)), flops=fl))
        out.append(row(f"resnet50.{name}.dgrad", dn, shape, bench(lambda: grad([True, False, False])), flops=fl))
        out.append(row(f"resnet50.{name}.wgrad", dn, shape, bench(lambda: grad([False, True, False])), flops=fl))
        del x, w, dy
print(json.dumps(out, indent=1))
