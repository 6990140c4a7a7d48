#!/bin/bash
# Call 11: twice the split-K slices where they fill waves of one workgroup per SM better (WGTRAIN_EXP_SPLIT=1,
# experimental) at GPT-2's dW products, interleaved, twice; the gpt2 fp16-mixed workload with it (its peak
# against the estimate).
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
for n in base exp base2 exp2; do
  e=X=1; case $n in exp*) e=WGTRAIN_EXP_SPLIT=1;; esac
  env $e timeout 100 $B bench --adapter vulkan --filter .dw --json $R/dw-$n.json > $R/dw-$n.txt 2>&1
  echo "$n $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
WGTRAIN_EXP_SPLIT=1 PRECISIONS=fp16-mixed WORKLOADS=gpt2 CHECKPOINTS=none timeout 100 scripts/gpt_workloads.sh $B /tmp/wl > $R/workload-exp.txt 2>&1
PRECISIONS=fp16-mixed WORKLOADS=gpt2 CHECKPOINTS=none timeout 100 scripts/gpt_workloads.sh $B /tmp/wl2 > $R/workload-base.txt 2>&1
echo "workloads $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for n in base exp base2 exp2; do echo "== $n"; grep -E "^gpt2" $R/dw-$n.txt | grep f16 | awk '{print $1, $(NF-5)}' | tr '\n' ';'; echo; done
grep -h run $R/workload-*.txt
