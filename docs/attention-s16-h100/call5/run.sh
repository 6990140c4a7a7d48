#!/bin/bash
# Call 5: the forward's flag array padded to 16 bytes (tiles of 1 and 2 subgroups were wrong in call 4);
# small tiles first; the attention test; per-kernel tile rows (bwd_q, bwd_kv: that kernel's tile forced, the
# other picked); the attention row and SDPA in the same call.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 100 .carry/tmp_fa128 > $R/fa128.txt 2>&1; log "fa128 rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
timeout 60 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
for t in sg4.bc16 sg2.bc16 sg4.bc32 sg1.bc16 sg2.bc32; do
  timeout 150 .carry/wgtrain bench --adapter vulkan --tune --filter tune.flash.$t.subgroup --json $R/tune-$t.json > $R/tune-$t.txt 2>&1
done; log tune
for i in 1 2; do timeout 100 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$i.json > $R/flash-$i.txt 2>&1; done; log bench
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -c "maxerr 0.000" $R/fa128.txt; grep -v "maxerr 0.000" $R/fa128.txt | cut -c1-150; grep -A3 panicked $R/flash-test.txt; tail -n 2 $R/flash-test.txt
grep -hE "^(tune|gpt2)" $R/tune-*.txt $R/flash-*.txt | awk '{print $1, $2, $7}'
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
