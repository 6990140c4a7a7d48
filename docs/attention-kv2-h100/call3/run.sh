#!/bin/bash
# Call 3 (same machine as call 2, same binary): the fp32 GPT workloads with the default
# kernels (two-row dK dV, the tiled dQ with the row dot) and with kv=lane (the one-row
# dK dV of the session's start); the bench and SDPA again.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
for v in default lane; do
  if [ $v = lane ]; then export WGTRAIN_TILED_ATTENTION=kv=lane; else unset WGTRAIN_TILED_ATTENTION; fi
  PRECISIONS=fp32 CHECKPOINTS="none every-layer" timeout 200 scripts/gpt_workloads.sh $B $R/wl-$v > $R/workloads-$v.txt 2>&1; echo "workloads $v rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
unset WGTRAIN_TILED_ATTENTION
timeout 120 $B bench --adapter vulkan --filter flash_attention.fwd_bwd --json $R/bench.json > $R/bench.txt 2>&1
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; echo "torch rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; cat $R/workloads-*.txt | grep -v "^$" | tail -30; grep fwd_bwd $R/bench.txt
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'flash_attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1))
"
