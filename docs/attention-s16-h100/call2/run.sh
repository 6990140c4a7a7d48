#!/bin/bash
# Call 2: heavy blocks first in the tensor-core attention, and the forward's O in fragments (rescaled only
# where a row's max moves by more than 2^8): the attention test, registers, the row against the commit
# before (wgtrain_base, eec2716), interleaved, and the tile sweep.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
timeout 60 .carry/shader_stats "flash_coop Forward sg" > $R/stats.jsonl 2>&1; log stats
timeout 60 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
for i in 1 2; do
  for b in wgtrain_base wgtrain; do
    timeout 100 .carry/$b bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$b-$i.json > $R/flash-$b-$i.txt 2>&1
    timeout 100 .carry/$b bench --adapter vulkan --tune --filter tune.flash.sg4.bc64.subgroup --json $R/tune-$b-$i.json > $R/tune-$b-$i.txt 2>&1
  done
done; log bench
timeout 200 .carry/wgtrain bench --adapter vulkan --tune --filter tune.flash --json $R/tune-all.json > $R/tune-all.txt 2>&1; log tune
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; tail -n 3 $R/flash-test.txt; grep -h "Register\|error" $R/stats.jsonl | cut -c1-160
for f in $R/flash-*.txt $R/tune-*.txt; do echo "== $(basename $f)"; grep -E "^(gpt2|tune)" $f | awk '{print $1, $2, $5}'; done
