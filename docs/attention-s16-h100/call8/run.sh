#!/bin/bash
# Call 8: where T is whole, each subgroup loads its own rows' fragments straight from qkv and dy (vector views);
# the attention test with every tile, registers, per-kernel tile rows, the attention row and SDPA.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 100 .carry/tmp_fa128 > $R/fa128.txt 2>&1; log "fa128 rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 300 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
timeout 120 .carry/shader_stats "flash_coop" > $R/stats.jsonl 2>&1; log stats
timeout 60 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
for t in sg4.bc16 sg2.bc16 sg4.bc32 sg2.bc32; do
  timeout 150 .carry/wgtrain bench --adapter vulkan --tune --filter tune.flash.$t.subgroup --json $R/tune-$t.json > $R/tune-$t.txt 2>&1
done; log tune
for i in 1 2; do timeout 100 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$i.json > $R/flash-$i.txt 2>&1; done; log bench
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -c "badrows 0 " $R/fa128.txt; grep -v "badrows 0 " $R/fa128.txt | cut -c1-150; grep -A3 panicked $R/flash-test.txt | cut -c1-400; grep "^test " $R/flash-test.txt; tail -n 2 $R/flash-test.txt
python3 -c "
import json
for l in open('$R/stats.jsonl'):
    try: r=json.loads(l)
    except: continue
    if 'subgroup' in r['kernel'] and ('bc16' in r['kernel'] or 'bc32' in r['kernel']): print(r['kernel'], r.get('Register Count'), r.get('Shared Memory Size'))
"
grep -hE "^(tune|gpt2)" $R/tune-*.txt $R/flash-*.txt | awk '{print $1, $2, $7, $(NF-1)}'
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
