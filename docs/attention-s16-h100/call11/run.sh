#!/bin/bash
# Call 11: an 8 x 16 tile (256 threads, 128 rows a workgroup, 23 KiB) in the sweep: the attention test with
# every tile, registers, and its per-kernel rows beside 4 x 16's.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 .carry/shader_stats "flash_coop" > $R/stats.jsonl 2>&1; log stats
timeout 60 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
for t in sg8.bc16 sg4.bc16; do
  timeout 150 .carry/wgtrain bench --adapter vulkan --tune --filter tune.flash.$t.subgroup --json $R/tune-$t.json > $R/tune-$t.txt 2>&1
done; log tune
WGTRAIN_TEST_ADAPTER=vulkan timeout 300 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -A3 panicked $R/flash-test.txt | cut -c1-300; tail -n 2 $R/flash-test.txt
grep -h "sg8" $R/stats.jsonl | cut -c1-120
grep -hE "^tune" $R/tune-*.txt | awk '{print $1, $(NF-5), $(NF-1)}'
