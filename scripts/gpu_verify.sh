#!/usr/bin/env bash
# Runs two wgtrain builds side by side on the GPU machine and checks that they compute
# the same bits: `wgtrain step` on every GPT-2 fixture (the loss and the sha256 of every
# dumped gradient) and the GPT workloads' per-step losses and peaks
# (scripts/gpt_workloads.sh, without checkpointing). Usage, on the GPU machine with the
# Vulkan loader in place (shared/GPU.md):
#   scripts/gpu_verify.sh BEFORE_BINARY AFTER_BINARY OUT
set -uo pipefail
before=$1; after=$2; out=$3
mkdir -p "$out"
for dir in tests/fixtures/gpt2/*/; do
    name=$(basename "$dir")
    for which in before after; do
        bin=$before; [ "$which" = after ] && bin=$after
        "$bin" step --adapter vulkan --hf-dir "$dir" --batch "$dir/batch.safetensors" --json \
            --dump-grads "$out/$name-$which.grads.safetensors" > "$out/$name-$which.json" 2> "$out/$name-$which.err"
    done
done
for which in before after; do
    bin=$before; [ "$which" = after ] && bin=$after
    CHECKPOINTS=none scripts/gpt_workloads.sh "$bin" "$out/wl-$which" > "$out/workloads-$which.txt" 2>&1
    rm -rf "$out/wl-$which/data"
done
python3 - "$out" <<'PY'
import glob, hashlib, json, os, sys
out = sys.argv[1]
digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) else None
report = {"step": {}, "workloads": {}}
for f in sorted(glob.glob(os.path.join(out, "*-before.json"))):
    name = os.path.basename(f)[: -len("-before.json")]
    load = lambda w: json.load(open(os.path.join(out, f"{name}-{w}.json")))
    g = lambda w: digest(os.path.join(out, f"{name}-{w}.grads.safetensors"))
    report["step"][name] = {"loss_equal": load("before")["loss"] == load("after")["loss"],
                            "grads_equal": g("before") is not None and g("before") == g("after")}
for f in sorted(glob.glob(os.path.join(out, "wl-before", "*.jsonl"))):
    name = os.path.basename(f)
    other = os.path.join(out, "wl-after", name)
    rows = lambda p: [(r.get("step"), r.get("loss"), (r.get("mem") or {}).get("peak")) for r in map(json.loads, open(p)) if "mem" in r]
    a, b = rows(f), rows(other) if os.path.exists(other) else []
    report["workloads"][name] = {"steps": len(a), "losses_and_peaks_equal": bool(a) and a == b}
print(json.dumps(report, indent=1))
PY
