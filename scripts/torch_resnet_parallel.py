"""PyTorch peer for the memory guides' two-GPU ResNet-50 table: torchvision's ResNet-50
in fp32 (TF32 off), SGD with momentum, synthetic 224x224 images, under DDP, FSDP2
(fully_shard per bottleneck block, then the whole model) or FSDP2 with
CPUOffloadPolicy, optionally with every block checkpointed or under fp16 autocast.
Prints one JSON line: images/s over both GPUs and each GPU's peak allocated memory.

    torchrun --nproc-per-node 2 scripts/torch_resnet_parallel.py --mode ddp --batch 188
    torchrun --nproc-per-node 2 scripts/torch_resnet_parallel.py --mode fsdp-offload --checkpoint
"""
import argparse, json, time
import torch, torchvision, torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["ddp", "fsdp", "fsdp-offload"], default="ddp")
p.add_argument("--batch", type=int, default=188, help="images per GPU")
p.add_argument("--steps", type=int, default=8)
p.add_argument("--checkpoint", action="store_true", help="recompute every bottleneck block in backward")
p.add_argument("--fp16", action="store_true", help="autocast fp16 with a GradScaler")
a = p.parse_args()
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank)
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
m = torchvision.models.resnet50().cuda()
blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
if a.checkpoint:
    for b in blocks:
        b.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(b.forward)
if a.mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(m, device_ids=[rank])
else:
    kw = {"offload_policy": CPUOffloadPolicy()} if a.mode == "fsdp-offload" else {}
    for b in blocks:
        fully_shard(b, **kw)
    model = fully_shard(m, **kw)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
scaler = torch.amp.GradScaler("cuda", enabled=a.fp16)
x = torch.randn(a.batch, 3, 224, 224, device="cuda")
y = torch.randint(0, 1000, (a.batch,), device="cuda")

def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=a.fp16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

for _ in range(3):
    step()
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); t = time.perf_counter()
for _ in range(a.steps):
    step()
torch.cuda.synchronize(); s = (time.perf_counter() - t) / a.steps
peak = torch.tensor([torch.cuda.max_memory_allocated()], device="cuda")
peaks = [torch.zeros_like(peak) for _ in range(world)]
dist.all_gather(peaks, peak)
if rank == 0:
    print(json.dumps({"peer": f"torch {torch.__version__}", "mode": a.mode, "checkpoint": a.checkpoint, "fp16": a.fp16,
                      "batch_per_gpu": a.batch, "img_s": round(world * a.batch / s, 1), "step_ms": round(s * 1e3, 1),
                      "peaks_MiB": [round(q.item() / 2 ** 20) for q in peaks]}), flush=True)
dist.destroy_process_group()
