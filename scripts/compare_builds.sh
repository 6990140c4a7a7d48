#!/usr/bin/env bash
# Compares two wgtrain binaries on one machine: the host time per recorded launch
# (`wgtrain bench --filter launch_overhead`, three alternating runs each) and
# `wgtrain step` on every GPT-2 fixture (loss and the sha256 of the dumped gradients,
# which must be equal bit for bit). Usage: scripts/compare_builds.sh BEFORE AFTER OUT
set -euo pipefail
before=$1; after=$2; out=$3
mkdir -p "$out"
for round in 1 2 3; do
    for which in before after; do
        bin=$before; [ "$which" = after ] && bin=$after
        "$bin" bench --filter launch_overhead --json "$out/launch-$which-$round.json" >/dev/null 2>"$out/launch-$which-$round.log"
    done
done
for dir in tests/fixtures/gpt2/*/; do
    name=$(basename "$dir")
    for which in before after; do
        bin=$before; [ "$which" = after ] && bin=$after
        "$bin" step --hf-dir "$dir" --batch "$dir/batch.safetensors" --json \
            --dump-grads "$out/$name-$which.grads.safetensors" >"$out/$name-$which.json" 2>/dev/null
    done
done
python3 - "$out" <<'PY'
import glob, hashlib, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "launch-*.json"))):
    which = os.path.basename(f).split("-")[1]
    for r in json.load(open(f)):
        rows.setdefault((r["kernel"], which), []).append(r["median_us"])
summary = {"launch_overhead_us": {}, "step": {}}
for (kernel, which), v in sorted(rows.items()):
    summary["launch_overhead_us"].setdefault(kernel, {})[which] = {"median": statistics.median(v), "runs": v}
for f in sorted(glob.glob(os.path.join(out, "*-before.json"))):
    name = os.path.basename(f)[: -len("-before.json")]
    if name.startswith("launch"):
        continue
    h = lambda w: hashlib.sha256(open(os.path.join(out, f"{name}-{w}.grads.safetensors"), "rb").read()).hexdigest()
    loss = lambda w: json.load(open(os.path.join(out, f"{name}-{w}.json")))["loss"]
    summary["step"][name] = {"loss_before": loss("before"), "loss_after": loss("after"), "grads_equal": h("before") == h("after")}
print(json.dumps(summary, indent=1))
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
