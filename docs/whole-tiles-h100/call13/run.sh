#!/bin/bash
# Call 13: the tiled f32 matmul's checked loads restored to their text before this session (the whole
# variant as template blocks), against 62014f8 (wgtrain_old), interleaved, twice: the f32 matmul and GPT-2 rows.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
timeout 60 .carry/wgtrain bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
for n in old new old2 new2; do
  B=.carry/wgtrain; case $n in old*) B=.carry/wgtrain_old;; esac
  timeout 120 $B bench --adapter vulkan --filter gpt2. --json $R/rows-$n.json > $R/rows-$n.txt 2>&1
  echo "$n $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
timeout 60 .carry/wgtrain bench --adapter vulkan --filter matmul_f32 --json $R/mm-f32.json > $R/mm-f32.txt 2>&1
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for n in old new old2 new2; do echo "== $n"; grep -E "^gpt2" $R/rows-$n.txt | grep " f32 " | grep -v attention | awk '{print $1, $(NF-5)}' | tr '\n' ';'; echo; done
grep -E "^matmul" $R/mm-f32.txt | awk '{print $1, $(NF-5)}'
