#!/bin/bash
# Call 10: the forward with two barriers a tile (a tile's P V added behind the next turn's uniform load of the
# flags; V double-buffered): the attention test with every tile, the forward rows and the attention row
# against the commit before (wgtrain_base, 3ec3864), interleaved, and SDPA.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
WGTRAIN_TEST_ADAPTER=vulkan timeout 300 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
timeout 60 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
for i in 1 2; do
  for b in wgtrain_base wgtrain; do
    timeout 100 .carry/$b bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$b-$i.json > $R/flash-$b-$i.txt 2>&1
    timeout 100 .carry/$b bench --adapter vulkan --tune --filter sg4.bc16.subgroup.prefetch.fwd --json $R/fwd-$b-$i.json > $R/fwd-$b-$i.txt 2>&1
  done
done; log bench
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -A3 panicked $R/flash-test.txt | cut -c1-400; tail -n 2 $R/flash-test.txt
for f in $R/flash-w*.txt $R/fwd-*.txt; do echo "== $(basename $f)"; grep -E "^(gpt2|tune)" $f | awk '{print $1, $2, $(NF-5), $(NF-1)}'; done
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
