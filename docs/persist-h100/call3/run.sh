#!/bin/bash
# Call 3: the two 128 x 128 tiles that by_waves weighs (2x2x4x4x32x1 "SLIM", 2x4x4x2x64x1a2 "AHEAD"),
# forced, at 4096^3 and every GPT-2 product with the default K split, interleaved, twice; cuBLAS and
# SDPA (scripts/torch_kernels.py) and the GPT workloads (no checkpointing) on the same code.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
for n in 1 2; do
  for t in 2x2x4x4x32x1 2x4x4x2x64x1a2; do
    timeout 100 $B bench --adapter vulkan --tune --filter tune.$t. --json $R/tune-$t-$n.json > $R/tune-$t-$n.txt 2>&1; log "$t-$n"
  done
done
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
CHECKPOINTS=none timeout 200 scripts/gpt_workloads.sh $B /tmp/wl > $R/workloads.txt 2>&1; log "workloads rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for n in 1 2; do for t in 2x2x4x4x32x1 2x4x4x2x64x1a2; do echo "== $t-$n"; grep -E "^tune" $R/tune-$t-$n.txt | awk '{print $1, $(NF-5)}' | sed "s/tune.$t.//" | tr '\n' ';'; echo; done; done
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
echo; grep run $R/workloads.txt
