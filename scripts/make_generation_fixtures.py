"""Greedy generations of transformers' `generate` for the GPT-2 and Llama fixtures under
tests/fixtures/{gpt2,llama}/: for each folder, two prompts of token ids and the tokens
`model.generate(..., do_sample=False)` continues them with (its key/value cache, float32),
written to generate.json beside the model. Prompts are drawn (seeded) until every
step's two likeliest logits differ by more than 1e-3, so float32 rounding elsewhere
cannot flip a choice.

Run on the GPU machine (transformers is installed there):
    python3 scripts/make_generation_fixtures.py tests/fixtures
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
out_root = sys.argv[2] if len(sys.argv) > 2 else root
FOLDERS = ["gpt2/l2_h2_c32", "gpt2/l3_h4_c48", "llama/l2_h4_kv2_c32", "llama/l1_h2_kv1_c16_tied"]
torch.backends.cuda.matmul.allow_tf32 = False

for folder in FOLDERS:
    model = AutoModelForCausalLM.from_pretrained(os.path.join(root, folder), dtype=torch.float32).cuda().eval()
    # No end-of-text token: exactly `new` tokens, none of them suppressed (min_new_tokens
    # would forbid the eos id, a token these small vocabularies' argmax may be).
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    cfg = model.config
    positions = getattr(cfg, "n_positions", None) or cfg.max_position_embeddings
    prompt_len, new = 4, min(12, positions - 4)
    gen = torch.Generator().manual_seed(0)
    for attempt in range(200):
        prompts = torch.randint(0, cfg.vocab_size, (2, prompt_len), generator=gen)
        with torch.no_grad():
            # Every prompt token attended to (a pad id would mask the tokens equal to it).
            out = model.generate(prompts.cuda(), attention_mask=torch.ones_like(prompts).cuda(), max_new_tokens=new,
                                 do_sample=False, output_scores=True, return_dict_in_generate=True,
                                 pad_token_id=cfg.vocab_size - 1)
        margins = []
        for scores in out.scores:
            top = scores.float().topk(2, dim=-1).values
            margins.append((top[:, 0] - top[:, 1]).min().item())
        if min(margins) > 1e-3:
            break
    else:
        raise SystemExit(f"{folder}: no prompt without a near tie")
    record = {
        "made_by": f"scripts/make_generation_fixtures.py with transformers {transformers.__version__}, torch {torch.__version__}",
        "prompts": prompts.tolist(),
        "tokens": out.sequences[:, prompt_len:].tolist(),
        "least_margin": min(margins),
    }
    os.makedirs(os.path.join(out_root, folder), exist_ok=True)
    with open(os.path.join(out_root, folder, "generate.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(folder, record["tokens"], "margin", record["least_margin"])
