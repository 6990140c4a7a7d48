#!/usr/bin/env bash
# The PyTorch memory guides' ResNet-50 table on two GPUs: wgtrain's per-device peaks
# (and their estimates) for data parallel, ZeRO 3 and ZeRO 3 with both offloads, each as
# is, with every block checkpointed and under fp16-mixed, at 188 images a GPU in fp32;
# then PyTorch DDP, FSDP2 and FSDP2 with CPUOffloadPolicy the same ways
# (scripts/torch_resnet_parallel.py). Run on a two-GPU machine:
#   scripts/resnet_guides_table.sh WGTRAIN_BINARY OUT_DIR
set -uo pipefail
bin=$1; out=$2; mkdir -p "$out"; here=$(dirname "$0")
per=${PER_GPU:-188}
# PART=wgtrain or PART=torch runs one side only; POLICIES="zero0 zero3" some of ours.
[ "${PART:-all}" = torch ] || for pol in ${POLICIES:-zero0 zero3 zero3-offload}; do
for extra in none checkpoint fp16; do
    tag="$pol-$extra"
    sets=(--set model.kind='"resnet"' --set model.depth=50 --set data.kind='"synthetic_images"'
        --set 'data.image=[3, 224, 224]' --set data.classes=1000 --set data.train_limit=$((per * 2 * 64))
        --set data.eval_limit=8 --set train.batch_size=$((per * 2)) --set train.steps=${STEPS:-6}
        --set train.eval_every=100000 --set train.optimizer='"sgd"' --set train.lr=0.1
        --set train.momentum=0.9 --set train.weight_decay=1e-4 --set 'parallel.devices=["0", "1"]')
    case $pol in
        zero0) sets+=(--set parallel.zero=0) ;;
        zero3) sets+=(--set parallel.zero=3) ;;
        zero3-offload) sets+=(--set parallel.zero=3 --set parallel.offload='"optimizer+parameters"') ;;
    esac
    case $extra in
        checkpoint) sets+=(--set memory.checkpoint='"every-layer"') ;;
        fp16) sets+=(--set memory.precision='"fp16-mixed"') ;;
    esac
    "$bin" estimate --adapter vulkan --json "${sets[@]}" > "$out/$tag.estimate.json" 2>"$out/$tag.estimate.err" || { echo "{\"run\": \"$tag\", \"error\": \"estimate failed\"}"; continue; }
    "$bin" train --quiet --adapter vulkan --log "$out/$tag.jsonl" "${sets[@]}" > "$out/$tag.txt" 2>&1 || { echo "{\"run\": \"$tag\", \"error\": \"train failed\"}"; tail -3 "$out/$tag.txt"; continue; }
    python3 - "$out/$tag.jsonl" "$tag" "$out/$tag.estimate.json" "$((per * 2))" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"mem"' in l]
later = steps[2:] or steps
ms = sorted(s["step_ms"] for s in later)[len(later) // 2]
peaks = [max(s["mem"]["devices"][d]["peak"] for s in steps[1:]) for d in range(2)]
est = json.load(open(sys.argv[3]))["device_peaks"]
print(json.dumps({"run": sys.argv[2], "img_s": round(int(sys.argv[4]) / ms * 1e3, 1), "median_step_ms": round(ms, 1),
                  "peaks_MiB": [round(p / 2**20) for p in peaks], "estimate_MiB": [round(e / 2**20) for e in est],
                  "exact": [int(p) for p in peaks] == [int(e) for e in est]}))
PY
done; done
[ "${PART:-all}" = wgtrain ] || for mode in ddp fsdp fsdp-offload; do
    for flag in "" --checkpoint --fp16; do
        timeout 240 torchrun --nproc-per-node 2 "$here/torch_resnet_parallel.py" --mode $mode --batch $per $flag 2>&1 | grep '^{' || echo "{\"peer\": \"$mode $flag\", \"error\": \"failed\"}"
    done
done
