"""The PyTorch peer of the multi-device table (docs/performance.md, "Several devices"): the
lean GPT-2 of the anchors (fused qkv, SDPA flash attention, tied head, gelu tanh; fp32,
TF32 off; AdamW lr 1e-3), 8 examples of 1024 random tokens per device, eager, as
- one device (run without torchrun),
- DDP (25 MB buckets, NCCL),
- FSDP2 (`fully_shard` per block and the root: ZeRO 3), alone, with CPU offload
  (CPUOffloadPolicy: parameters, gradients and the optimizer on the host), and with
  every block checkpointed.
Prints a JSON line per run: median step (steps 4-10), samples/s, each rank's peak
allocated memory.
    python3 scripts/torch_gpt2_parallel.py                         # one device
    torchrun --standalone --nproc_per_node=2 scripts/torch_gpt2_parallel.py
    BACKEND=gloo MODES=ddp torchrun --standalone --nproc_per_node=2 scripts/torch_gpt2_parallel.py
"""
import json, os, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
V, T, L, H, D, B = 50257, 1024, 12, 12, 768, 8


class Block(nn.Module):
    def __init__(s, d, h, ckpt=False):
        super().__init__()
        s.h, s.ckpt = h, ckpt
        s.ln1, s.qkv, s.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.ln2, s.fc, s.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def inner(s, x):
        b, t, c = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(c, 2)
        q, k, v = [z.view(b, t, s.h, c // s.h).transpose(1, 2) for z in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))

    def forward(s, x):
        return checkpoint(s.inner, x, use_reentrant=False) if s.ckpt else s.inner(x)


class GPT(nn.Module):
    def __init__(s, ckpt=False):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList([Block(D, H, ckpt) for _ in range(L)])
        s.lnf = nn.LayerNorm(D)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = F.linear(s.lnf(x), s.wte.weight)
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1))


def run(mode, rank, world):
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    ckpt = mode.endswith("ckpt")
    m = GPT(ckpt).cuda()
    offload = "offload" in mode
    if mode == "ddp":
        m = nn.parallel.DistributedDataParallel(m, device_ids=[rank], bucket_cap_mb=25)
    elif mode.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard, CPUOffloadPolicy
        kw = {"offload_policy": CPUOffloadPolicy()} if offload else {}
        for b in m.blocks:
            fully_shard(b, **kw)
        fully_shard(m, **kw)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=not offload)
    g = torch.Generator(device="cuda").manual_seed(rank)
    idx = torch.randint(0, V, (B, T), device="cuda", generator=g)

    def step():
        loss = m(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(10):
        torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        if i == 3:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    ms = sorted(times[3:])[len(times[3:]) // 2] * 1e3
    peak = torch.cuda.max_memory_allocated() >> 20
    peaks = [peak]
    if world > 1:
        peaks = [None] * world
        dist.all_gather_object(peaks, peak)
    if rank == 0:
        print(json.dumps({"peer": "torch " + torch.__version__, "run": mode, "backend": os.environ.get("BACKEND", "nccl"), "devices": world, "median_step_ms": round(ms, 1),
                          "samples_per_s": round(B * world / ms * 1e3, 1), "peak_MiB": peaks}), flush=True)
    del m, opt


def main():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(rank)
    # BACKEND: nccl (default) or gloo (through host memory, as MPI runs); MODES: which
    # runs, comma-separated.
    backend = os.environ.get("BACKEND", "nccl")
    if world > 1:
        dist.init_process_group(backend, device_id=torch.device("cuda", rank) if backend == "nccl" else None)
        modes = ["ddp", "fsdp", "fsdp-offload", "fsdp-offload-ckpt", "ddp-ckpt"]
    else:
        modes = ["single", "single-ckpt"]
    if os.environ.get("MODES"):
        modes = os.environ["MODES"].split(",")
    for mode in modes:
        run(mode, rank, world)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
