#!/usr/bin/env bash
# Is `wgtrain bench` reproducible? Runs it twice on this machine (the second run
# compared with the first), then PyTorch's times for the same rows
# (scripts/torch_kernels.py), recording the GPU's clocks before each.
# Usage: scripts/bench_stability.sh BIN OUT_DIR [LABEL]
# Run it again on a freshly started machine with LABEL=fresh and compare:
#   BIN bench --compare OUT_DIR/bench-1.json
set -euo pipefail
bin=$1
out=$2
label=${3:-same}
mkdir -p "$out"
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader 2>/dev/null || true; }
if [ "$label" = same ]; then
  echo "clocks before run 1: $(clocks)" | tee "$out/clocks.txt"
  "$bin" bench --json "$out/bench-1.json" > "$out/bench-1.txt" 2>&1
  echo "clocks before run 2: $(clocks)" | tee -a "$out/clocks.txt"
  "$bin" bench --json "$out/bench-2.json" --compare "$out/bench-1.json" > "$out/bench-2.txt" 2>&1
  if python3 -c "import torch" 2>/dev/null; then
    python3 "$(dirname "$0")/torch_kernels.py" > "$out/torch-kernels.json"
  fi
else
  echo "clocks before the $label run: $(clocks)" | tee "$out/clocks-$label.txt"
  "$bin" bench --json "$out/bench-$label.json" > "$out/bench-$label.txt" 2>&1
fi
