#!/bin/bash
# Call 12: the forward picks 8 x 16 first: the attention row twice, SDPA, and the attention test.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
for i in 1 2; do timeout 100 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$i.json > $R/flash-$i.txt 2>&1; done; log bench
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 300 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -A3 panicked $R/flash-test.txt | cut -c1-300; tail -n 2 $R/flash-test.txt
grep -hE "^gpt2" $R/flash-*.txt | awk '{print $1, $2, $(NF-5), $(NF-1)}'
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
