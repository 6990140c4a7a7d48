#!/bin/bash
# Call 3: workgroups resident per SM by workgroup memory and registers (examples/occupancy_probe), and the
# attention test with head size 128's forward fetching when it stashes.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 200 .carry/occupancy_probe vulkan 132 > $R/occupancy.jsonl 2> $R/occupancy.err; log "probe rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; cat $R/occupancy.jsonl; tail -3 $R/occupancy.err; grep -A3 "panicked" $R/flash-test.txt; tail -n 2 $R/flash-test.txt
