"""Makes the Llama and BERT fixtures under tests/fixtures/{llama,bert}/: small
LlamaForCausalLM and BertForMaskedLM models written by transformers' save_pretrained, a
batch, and the loss and every parameter's gradient computed by PyTorch in float64 from
the same float32 weights (as scripts/make_gpt2_fixtures.py does for GPT-2).

Run on the GPU machine (transformers is installed there):
    python3 scripts/make_llama_bert_fixtures.py tests/fixtures
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import BertConfig, BertForMaskedLM, LlamaConfig, LlamaForCausalLM

root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"

LLAMA = [
    # name, layers, heads, kv heads, width, mlp width, vocab, positions, batch, seq, eps, tied, theta, ignored
    ("l1_h2_kv1_c16_tied", 1, 2, 1, 16, 40, 37, 32, 2, 8, 1e-6, True, 10000.0, 0),
    ("l2_h4_kv2_c32", 2, 4, 2, 32, 64, 67, 32, 2, 12, 1e-5, False, 500000.0, 3),
    ("l2_h4_kv4_c32_mha", 2, 4, 4, 32, 48, 53, 64, 3, 20, 1e-6, False, 10000.0, 5),
]

BERT = [
    # name, layers, heads, width, mlp width, vocab, positions, batch, seq, padded
    ("l1_h2_c16", 1, 2, 16, 40, 37, 32, 2, 8, False),
    ("l2_h4_c32_padded", 2, 4, 32, 64, 67, 32, 3, 12, True),
]


def perturb(model):
    with torch.no_grad():
        # Move away from the tiny initialisation so that gradients are not all near 0.
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))


def write(d, ref, out, meta):
    out.loss.backward()
    grads = {n: p.grad.float().contiguous() for n, p in ref.named_parameters()}
    grads["loss"] = out.loss.detach().float().reshape(1)
    save_file(grads, os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "README.txt"), "w") as f:
        f.write(f"Made by scripts/make_llama_bert_fixtures.py with torch {torch.__version__}, "
                f"transformers {transformers.__version__}; loss {out.loss.item():.8f}\n")
    print(json.dumps({**meta, "loss": out.loss.item(), "params": sum(p.numel() for p in ref.parameters())}))


for name, n_layer, heads, kv, width, inter, vocab, positions, b, t, eps, tied, theta, ignored in LLAMA:
    torch.manual_seed(sum(map(ord, name)))
    cfg = LlamaConfig(num_hidden_layers=n_layer, num_attention_heads=heads, num_key_value_heads=kv, hidden_size=width,
                      intermediate_size=inter, vocab_size=vocab, max_position_embeddings=positions, rms_norm_eps=eps,
                      tie_word_embeddings=tied, rope_theta=theta, attention_dropout=0.0, hidden_act="silu")
    model = LlamaForCausalLM(cfg)
    perturb(model)
    d = os.path.join(root, "llama", name)
    model.save_pretrained(d, safe_serialization=True)
    ids = torch.randint(0, vocab, (b, t), dtype=torch.int64)
    labels = ids.clone()
    if ignored:
        labels.view(-1)[torch.randperm(b * t)[:ignored]] = -100
    save_file({"input_ids": ids, "labels": labels}, os.path.join(d, "batch.safetensors"))
    ref = LlamaForCausalLM.from_pretrained(d, attn_implementation="eager").double()
    ref.train()
    write(d, ref, ref(input_ids=ids, labels=labels), {"fixture": "llama/" + name})

for name, n_layer, heads, width, inter, vocab, positions, b, t, padded in BERT:
    torch.manual_seed(sum(map(ord, name)))
    cfg = BertConfig(num_hidden_layers=n_layer, num_attention_heads=heads, hidden_size=width, intermediate_size=inter,
                     vocab_size=vocab, max_position_embeddings=positions, type_vocab_size=2, hidden_act="gelu",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12)
    model = BertForMaskedLM(cfg)
    perturb(model)
    d = os.path.join(root, "bert", name)
    model.save_pretrained(d, safe_serialization=True)
    ids = torch.randint(0, vocab, (b, t), dtype=torch.int64)
    types = (torch.arange(t)[None, :] >= t // 2).long().expand(b, t).contiguous()
    mask = torch.ones(b, t, dtype=torch.int64)
    if padded:
        for r in range(1, b):
            mask[r, t - 2 * r:] = 0  # padding at the end of later rows
    labels = torch.full((b, t), -100, dtype=torch.int64)
    chosen = torch.rand(b, t) < 0.3
    chosen[:, 0] = True
    chosen &= mask.bool()
    labels[chosen] = ids[chosen]
    save_file({"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels},
              os.path.join(d, "batch.safetensors"))
    ref = BertForMaskedLM.from_pretrained(d, attn_implementation="eager").double()
    ref.train()
    write(d, ref, ref(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels),
          {"fixture": "bert/" + name})
