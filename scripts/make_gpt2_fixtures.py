"""Makes the GPT-2 fixtures under tests/fixtures/gpt2/: small GPT2LMHeadModel configs
written by transformers' save_pretrained, a batch, and the loss and every parameter's
gradient computed by PyTorch in float64 from the same float32 weights.

Run on the GPU machine (transformers is installed there):
    python3 scripts/make_gpt2_fixtures.py tests/fixtures/gpt2
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

CONFIGS = [
    # name, layers, heads, width, vocab, positions, batch, seq, eps, ignored labels
    ("l1_h1_c16", 1, 1, 16, 37, 8, 2, 8, 1e-5, 0),
    ("l2_h2_c32", 2, 2, 32, 67, 16, 2, 12, 1e-5, 3),
    ("l3_h4_c48", 3, 4, 48, 101, 32, 3, 20, 1e-6, 5),
]

out_root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gpt2"
for name, n_layer, n_head, n_embd, vocab, positions, b, t, eps, ignored in CONFIGS:
    torch.manual_seed(hash(name) % 2**31)
    cfg = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab, n_positions=positions,
                     layer_norm_epsilon=eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     activation_function="gelu_new", tie_word_embeddings=True)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        # Move away from the tiny initialisation so that gradients are not all near 0.
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    d = os.path.join(out_root, name)
    model.save_pretrained(d, safe_serialization=True)
    ids = torch.randint(0, vocab, (b, t), dtype=torch.int64)
    labels = ids.clone()
    if ignored:
        labels.view(-1)[torch.randperm(b * t)[:ignored]] = -100
    save_file({"input_ids": ids, "labels": labels}, os.path.join(d, "batch.safetensors"))
    ref = GPT2LMHeadModel.from_pretrained(d, attn_implementation="eager").double()
    ref.train()  # dropout probabilities are 0
    out = ref(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.float().contiguous() for n, p in ref.named_parameters()}
    grads["loss"] = out.loss.detach().float().reshape(1)
    save_file(grads, os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "README.txt"), "w") as f:
        f.write(f"Made by scripts/make_gpt2_fixtures.py with torch {torch.__version__}; loss {out.loss.item():.8f}\n")
    print(json.dumps({"fixture": name, "loss": out.loss.item(), "params": sum(p.numel() for p in ref.parameters())}))
