"""Random nanoGPT-style token files for shared/ANCHORS.md's workloads: OUT/char
(vocabulary 65), OUT/gpt2 (50257) and OUT/llama (32000), each with train.bin (4M u16 tokens) and val.bin
(200k). Used by scripts/gpt_workloads.sh and scripts/profile_gpt_workloads.sh.
Usage: python3 scripts/make_token_data.py OUT"""
import os
import sys

import numpy as np

root = sys.argv[1]
for name, vocab in [("char", 65), ("gpt2", 50257), ("llama", 32000)]:
    rng = np.random.default_rng(0)
    os.makedirs(f"{root}/{name}", exist_ok=True)
    for split, n in [("train", 4_000_000), ("val", 200_000)]:
        rng.integers(0, vocab, n, dtype=np.uint16).tofile(f"{root}/{name}/{split}.bin")
