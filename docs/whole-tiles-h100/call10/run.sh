#!/bin/bash
# Call 10: the submitted code (de36f29): the attention and the tensor-core matmul rows (twice) with SDPA and
# cuBLAS in the same call.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
for i in 1 2; do
  timeout 100 $B bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$i.json > $R/flash-$i.txt 2>&1
  timeout 100 $B bench --adapter vulkan --filter matmul_coop --json $R/mm-$i.json > $R/mm-$i.txt 2>&1
  echo "bench $i $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; echo "torch rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -h -E "fwd_bwd|matmul_coop" $R/flash-*.txt $R/mm-*.txt | awk '{print $1, $2, $(NF-5)}'
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'flash' in r['kernel'] or r['kernel'].startswith('matmul'): print(r['kernel'], r['dtype'], round(r['median_us'],1))
"
