#!/bin/bash
# Call 9: the tensor-core attention's tile loads and stashes without the load-index check where every thread's
# loads fall inside the tile (FULL), against 65a74a1 (wgtrain_old), interleaved, twice; the attention test; the
# driver's code of the picked tiles.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
timeout 60 .carry/wgtrain bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
for n in old new old2 new2; do
  B=.carry/wgtrain; case $n in old*) B=.carry/wgtrain_old;; esac
  timeout 100 $B bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$n.json > $R/flash-$n.txt 2>&1
  echo "$n $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/flash_test > $R/flash-test.txt 2>&1; echo "flash test rc=$?" >> $R/log.txt
SHADER_DUMP=$R/sass timeout 60 .carry/shader_stats "sg4.bc64.subgroup" > $R/stats-fa.jsonl 2>&1; rm -f $R/sass/*.wgsl
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -h fwd_bwd $R/flash-*.txt | awk '{print $1, $2, $(NF-5)}'; tail -n 2 $R/flash-test.txt
