#!/bin/bash
# Call 7: the tile sweep for the four 128 x 128 tiles by_waves weighs and the 128 x 256 tile, with whole
# tiles loaded unchecked (4096^3 and GPT-2's products).
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s); B=.carry/wgtrain
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
for t in 2x2x4x4x32x1 2x4x4x2x64x1a2 4x4x2x2x32x1a2 2x4x4x4x32x1; do
  timeout 150 $B bench --adapter vulkan --tune --filter tune.$t. --json $R/tune-$t.json > $R/tune-$t.txt 2>&1
  echo "$t $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for t in 2x2x4x4x32x1 2x4x4x2x64x1a2 4x4x2x2x32x1a2 2x4x4x4x32x1; do echo "== $t"; grep -E "^tune" $R/tune-$t.txt | awk '{print $1, $(NF-5)}' | tr '\n' ';'; echo; done
