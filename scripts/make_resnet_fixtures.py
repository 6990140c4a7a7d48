"""Makes the ResNet fixtures under tests/fixtures/resnet/: small
ResNetForImageClassification models (basic and bottleneck blocks, projection
shortcuts, odd image sizes) written by transformers' save_pretrained, a batch
(pixel_values, labels), and what one training-mode step gives in PyTorch float64
from the same float32 weights: the loss, every parameter's gradient, and every
BatchNorm's running statistics after the step.

Run on the GPU machine (transformers is installed there):
    python3 scripts/make_resnet_fixtures.py tests/fixtures
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import ResNetConfig, ResNetForImageClassification

root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"

CASES = [
    # name, layer type, embedding, hidden sizes, depths, classes, batch, channels, height, width, first stage downsamples
    ("basic_e8_h8x16_d1x2", "basic", 8, [8, 16], [1, 2], 5, 3, 3, 29, 23, False),
    ("bottleneck_e8_h16x32_d2x1", "bottleneck", 8, [16, 32], [2, 1], 7, 2, 3, 33, 37, True),
    ("bottleneck_e4_h8x16x32_d1x1x1_gray", "bottleneck", 4, [8, 16, 32], [1, 1, 1], 4, 4, 1, 32, 32, False),
]

for name, layer, emb, hidden, depths, classes, b, c, h, w, first in CASES:
    torch.manual_seed(sum(map(ord, name)))
    cfg = ResNetConfig(num_channels=c, embedding_size=emb, hidden_sizes=hidden, depths=depths, layer_type=layer,
                       hidden_act="relu", downsample_in_first_stage=first, num_labels=classes)
    model = ResNetForImageClassification(cfg)
    with torch.no_grad():
        # Running statistics and affine parameters away from their initial values, so a
        # wrong momentum or a swapped weight/bias shows.
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.3, 0.3)
                m.num_batches_tracked.fill_(3)
    d = os.path.join(root, "resnet", name)
    model.save_pretrained(d, safe_serialization=True)
    pixels = torch.randn(b, c, h, w, dtype=torch.float32)
    labels = torch.randint(0, classes, (b,), dtype=torch.int64)
    save_file({"pixel_values": pixels, "labels": labels}, os.path.join(d, "batch.safetensors"))
    ref = ResNetForImageClassification.from_pretrained(d).double()
    ref.train()
    out = ref(pixel_values=pixels.double(), labels=labels)
    out.loss.backward()
    expected = {n: p.grad.float().contiguous() for n, p in ref.named_parameters()}
    for n, buf in ref.named_buffers():
        expected[n] = buf.float().contiguous().reshape(buf.shape)
    expected["loss"] = out.loss.detach().float().reshape(1)
    save_file(expected, os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "README.txt"), "w") as f:
        f.write(f"Made by scripts/make_resnet_fixtures.py with torch {torch.__version__}, "
                f"transformers {transformers.__version__}; loss {out.loss.item():.8f}\n")
    print(json.dumps({"fixture": "resnet/" + name, "loss": out.loss.item(),
                      "params": sum(p.numel() for p in ref.parameters())}))
