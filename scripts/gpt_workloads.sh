#!/usr/bin/env bash
# Runs shared/ANCHORS.md's workloads (char and gpt2 GPTs, the llama) through `wgtrain train` in
# fp32 and fp16-mixed, with and without every-layer activation checkpointing, on random
# token files, and prints step time, peak memory and `wgtrain estimate`'s prediction of
# the peak per run. Run on the GPU machine:
#   scripts/gpt_workloads.sh WGTRAIN_BINARY OUT_DIR
set -euo pipefail
bin=$1; out=$2; mkdir -p "$out/data"
python3 "$(dirname "$0")/make_token_data.py" "$out/data"
run() { # name vocab layers heads width seq batch checkpoint precision [more --set pairs]
    local tag="$1-$9-$8"
    local kind='"gpt"'; [ "$1" = llama ] && kind='"llama"'
    local sets=(--set model.kind="$kind" --set data.kind='"tokens"' --set data.path="\"$out/data/$1\""
        --set model.vocab_size=$2 --set model.n_layer=$3 --set model.n_head=$4 --set model.n_embd=$5
        --set model.block_size=$6 --set train.batch_size=$7 --set train.steps=12 --set train.eval_every=1000
        --set data.eval_limit=8 --set memory.checkpoint="\"$8\"" --set memory.precision="\"$9\"" "${@:10}")
    "$bin" estimate --adapter vulkan --json "${sets[@]}" > "$out/$tag.estimate.json" 2>/dev/null || { echo "$tag estimate failed"; return; }
    "$bin" train --quiet --adapter vulkan --log "$out/$tag.jsonl" "${sets[@]}" > "$out/$tag.txt" 2>&1 || { echo "$tag failed"; tail -3 "$out/$tag.txt"; return; }
    python3 - "$out/$tag.jsonl" "$tag" "$out/$tag.estimate.json" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"mem"' in l]
later = steps[2:]
ms = sorted(s["step_ms"] for s in later)[len(later) // 2]
peak = max(s["mem"]["peak"] for s in steps)
est = json.load(open(sys.argv[3]))["peak_bytes"]
print(json.dumps({"run": sys.argv[2], "median_step_ms": round(ms, 1), "peak_MiB": round(peak / 2**20),
                  "estimate_MiB": round(est / 2**20), "estimate_error": round(est / peak - 1, 4),
                  "skipped": sum(1 for s in steps if s.get("skipped")),
                  "loss_first": round(steps[0]["loss"], 3), "loss_last": round(steps[-1]["loss"], 3)}))
PY
}
# PRECISIONS, WORKLOADS and CHECKPOINTS pick a subset (all by default).
for p in ${PRECISIONS:-fp32 fp16-mixed}; do
    for w in ${WORKLOADS:-char gpt2}; do
        for c in ${CHECKPOINTS:-none every-layer}; do
            case $w in
                char) run char 65 6 6 384 256 64 "$c" "$p" ;;
                gpt2) run gpt2 50257 12 12 768 1024 8 "$c" "$p" ;;
                llama) run llama 32000 12 12 768 1024 8 "$c" "$p" --set model.n_kv_head=4 --set model.intermediate_size=2048 ;;
            esac
        done
    done
done
