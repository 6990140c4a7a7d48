"""Loads a folder wgtrain wrote (Gpt::save_hf) with transformers and checks that the
logits equal those of the source fixture. Run on the GPU machine:
    python3 scripts/check_hf_roundtrip.py SAVED_DIR FIXTURE_DIR
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel

saved, fixture = sys.argv[1], sys.argv[2]
a = GPT2LMHeadModel.from_pretrained(saved).eval()
b = GPT2LMHeadModel.from_pretrained(fixture).eval()
ids = load_file(f"{fixture}/batch.safetensors")["input_ids"]
with torch.no_grad():
    diff = (a(ids).logits - b(ids).logits).abs().max().item()
print({"max_logit_diff": diff})
assert diff == 0.0, diff
