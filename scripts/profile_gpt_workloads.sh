#!/usr/bin/env bash
# Profiles shared/ANCHORS.md's GPT workloads (gpt2 and char shapes, fp32 and fp16-mixed)
# with `wgtrain profile` on random token files, and measures profiling's cost: the same
# steps through `wgtrain train` without it. Run on the GPU machine:
#   scripts/profile_gpt_workloads.sh WGTRAIN_BINARY OUT_DIR
set -euo pipefail
bin=$1; out=$2; mkdir -p "$out/data"
python3 "$(dirname "$0")/make_token_data.py" "$out/data"
sets() { # name vocab layers heads width seq batch precision
    echo --set model.kind='"gpt"' --set data.kind='"tokens"' --set data.path="\"$out/data/$1\"" \
        --set model.vocab_size=$2 --set model.n_layer=$3 --set model.n_head=$4 --set model.n_embd=$5 \
        --set model.block_size=$6 --set train.batch_size=$7 --set memory.precision="\"$8\"" \
        --set train.eval_every=1000000 --set data.eval_limit=8
}
for p in fp32 fp16-mixed; do
    for w in "gpt2 50257 12 12 768 1024 8" "char 65 6 6 384 256 64"; do
        set -- $w
        tag="$1-$p"
        # shellcheck disable=SC2046
        "$bin" profile --adapter vulkan $(sets $w $p) --steps 5 --warmup 3 \
            --json "$out/$tag.profile.json" --trace "$out/$tag.trace.json" > "$out/$tag.profile.txt" 2>&1
        # shellcheck disable=SC2046
        "$bin" train --quiet --adapter vulkan $(sets $w $p) --set train.steps=8 --log "$out/$tag.train.jsonl" > /dev/null 2>&1
        python3 - "$out/$tag.profile.json" "$out/$tag.train.jsonl" "$tag" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
steps = [json.loads(l) for l in open(sys.argv[2]) if '"mem"' in l][3:]
plain = sorted(s["step_ms"] for s in steps)[len(steps) // 2]
print(json.dumps({"run": sys.argv[3], "profiled_step_ms": round(p["step_ms"], 1), "gpu_ms": round(p["gpu_ms"], 1),
                  "plain_step_ms": round(plain, 1), "overhead": round(p["step_ms"] / plain - 1, 4),
                  "launches_per_step": p["launches_per_step"], "model_tflops": round(p["model_tflops"], 2),
                  "mfu": p["mfu"], "top": [(k["name"], round(k["pct"], 1)) for k in p["kernels"][:5]]}))
PY
    done
done
