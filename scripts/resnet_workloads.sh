#!/usr/bin/env bash
# Runs ResNet-50 (the PyTorch memory guides' headline workload) through `wgtrain train`
# on synthetic 224x224 images (SGD with momentum, as shared/reference/torch_resnet50.py)
# at batch 128 and 256 in fp32 and fp16-mixed, and prints per run the median step time,
# images/s, the peak and `wgtrain estimate`'s prediction of it. Run on the GPU machine:
#   scripts/resnet_workloads.sh WGTRAIN_BINARY OUT_DIR
# BATCHES, PRECISIONS, DEPTH and CHECKPOINTS pick a subset; STEPS the steps per run.
set -euo pipefail
bin=$1; out=$2; mkdir -p "$out"
for depth in ${DEPTH:-50}; do
for b in ${BATCHES:-128 256}; do
for p in ${PRECISIONS:-fp32 fp16-mixed}; do
for c in ${CHECKPOINTS:-none}; do
    tag="resnet$depth-b$b-$p-$c"
    sets=(--set model.kind='"resnet"' --set model.depth=$depth --set data.kind='"synthetic_images"'
        --set 'data.image=[3, 224, 224]' --set data.classes=1000 --set data.train_limit=$((b * 64))
        --set data.eval_limit=8 --set train.batch_size=$b --set train.steps=${STEPS:-12}
        --set train.eval_every=100000 --set train.optimizer='"sgd"' --set train.lr=0.1
        --set train.momentum=0.9 --set train.weight_decay=1e-4 --set memory.precision="\"$p\""
        --set memory.checkpoint="\"$c\"")
    "$bin" estimate --adapter vulkan --json "${sets[@]}" > "$out/$tag.estimate.json" 2>"$out/$tag.estimate.err" || { echo "{\"run\": \"$tag\", \"error\": \"estimate failed\"}"; continue; }
    "$bin" train --quiet --adapter vulkan --log "$out/$tag.jsonl" "${sets[@]}" > "$out/$tag.txt" 2>&1 || { echo "{\"run\": \"$tag\", \"error\": \"train failed\"}"; tail -3 "$out/$tag.txt"; continue; }
    python3 - "$out/$tag.jsonl" "$tag" "$out/$tag.estimate.json" "$b" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"mem"' in l]
later = steps[2:]
ms = sorted(s["step_ms"] for s in later)[len(later) // 2]
peak = max(s["mem"]["peak"] for s in steps[1:])
est = json.load(open(sys.argv[3]))["peak_bytes"]
b = int(sys.argv[4])
print(json.dumps({"run": sys.argv[2], "median_step_ms": round(ms, 1), "img_s": round(b / ms * 1e3, 1),
                  "peak_MiB": round(peak / 2**20), "estimate_MiB": round(est / 2**20),
                  "estimate_error": round(est / peak - 1, 4), "skipped": sum(1 for s in steps if s.get("skipped")),
                  "loss_first": round(steps[0]["loss"], 3), "loss_last": round(steps[-1]["loss"], 3)}))
PY
done; done; done; done
