#!/usr/bin/env bash
# The multi-device table of docs/performance.md: gpt2 fp32 (L12, C768, T1024) on random
# tokens, 8 examples per device, on one device and on two (the first two NVIDIA Vulkan
# adapters `wgtrain devices` lists) with ZeRO stages 0-3, offloads and every-layer
# checkpointing; each run's log (mem.devices, mem.host), its stderr with each rank's
# host timings (WGTRAIN_PARALLEL_TIMES=1), and a summary line per run.
# With run names after OUT_DIR, only those runs (e.g. z0 z3).
#   scripts/parallel_workloads.sh WGTRAIN_BINARY OUT_DIR [RUN...]
set -uo pipefail
bin=$1; out=$2; shift 2; only=" $* "; mkdir -p "$out/data"
python3 "$(dirname "$0")/make_token_data.py" "$out/data"
"$bin" devices > "$out/devices.txt" 2>&1
idx=($(grep -E '^\[[0-9]+\].*NVIDIA.*vulkan' "$out/devices.txt" | sed -E 's/^\[([0-9]+)\].*/\1/'))
[ ${#idx[@]} -ge 2 ] || { echo "two NVIDIA Vulkan adapters needed; found: ${idx[*]}"; exit 1; }
base=(--set model.kind='"gpt"' --set data.kind='"tokens"' --set data.path="\"$out/data/gpt2\"" --set model.vocab_size=50257
      --set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024
      --set train.steps=7 --set train.eval_every=100000 --set data.eval_limit=8 --set memory.precision='"fp32"')
two=(--set train.batch_size=16 --set "parallel.devices=[${idx[0]},${idx[1]}]")
run() { # tag, sets...
    local tag=$1; shift
    [ "$only" = "  " ] || [[ "$only" == *" $tag "* ]] || return 0
    timeout 150 "$bin" estimate --json "${base[@]}" "$@" > "$out/$tag.estimate.json" 2> "$out/$tag.estimate.err"
    WGTRAIN_PARALLEL_TIMES=1 timeout 200 "$bin" train --quiet --adapter "${idx[0]}" --log "$out/$tag.jsonl" "${base[@]}" "$@" > "$out/$tag.txt" 2>&1
    python3 - "$out/$tag.jsonl" "$out/$tag.estimate.json" "$tag" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"mem"' in l]
later = sorted(s["step_ms"] for s in steps[2:])
ms = later[len(later) // 2]
devs = len(steps[-1]["mem"].get("devices") or [0])
peaks = [max((s["mem"].get("devices") or [s["mem"]])[d]["peak"] for s in steps) >> 20 for d in range(devs)]
try:
    est = json.load(open(sys.argv[2])); est = [p >> 20 for p in (est.get("device_peaks") or [est["peak_bytes"]])]
except Exception:
    est = None
examples = round(steps[-1]["samples_per_s"] * steps[-1]["step_ms"] / 1000)
print(json.dumps({"run": sys.argv[3], "median_step_ms": round(ms, 1), "samples_per_s": round(examples / ms * 1000, 1),
                  "peak_MiB": peaks, "estimate_MiB": est, "host": steps[-1]["mem"].get("host")}))
PY
}
run single --set train.batch_size=8
run z0 "${two[@]}" --set parallel.zero=0
run z1 "${two[@]}" --set parallel.zero=1
run z2 "${two[@]}" --set parallel.zero=2
run z2off "${two[@]}" --set parallel.zero=2 --set parallel.offload='"optimizer"'
run z3 "${two[@]}" --set parallel.zero=3
run single-ckpt --set train.batch_size=8 --set memory.checkpoint='"every-layer"'
run z2off-ckpt "${two[@]}" --set parallel.zero=2 --set parallel.offload='"optimizer"' --set memory.checkpoint='"every-layer"'
run z3offp-ckpt "${two[@]}" --set parallel.zero=3 --set parallel.offload='"optimizer+parameters"' --set memory.checkpoint='"every-layer"'
rm -rf "$out/data"
