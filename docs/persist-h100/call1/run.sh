#!/bin/bash
# Call 1: the persistent tensor-core matmul (one workgroup per SM taking tiles in turn, the next
# tile's first K tiles fetched during this one's last turn) against one workgroup a tile
# (WGTRAIN_EXP_PERSIST=0), interleaved, twice; split products with 16 and 32 slices; the f16
# matmul tests on the H100.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
B=.carry/wgtrain
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn f16_matmul > $R/nn.txt 2>&1
echo "nn $(( $(date +%s) - s0 ))s" >> $R/log.txt
for n in on off on2 off2; do
  case $n in off*) export WGTRAIN_EXP_PERSIST=0;; *) unset WGTRAIN_EXP_PERSIST;; esac
  timeout 120 $B bench --adapter vulkan --filter gpt2. --json $R/rows-$n.json > $R/rows-$n.txt 2>&1
  timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 --json $R/mm-$n.json > $R/mm-$n.txt 2>&1
  echo "$n $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
unset WGTRAIN_EXP_PERSIST
for sl in 16 32; do
  WGTRAIN_EXP_SLICES=$sl timeout 60 $B bench --adapter vulkan --filter .dw --json $R/dw-$sl.json > $R/dw-$sl.txt 2>&1
  echo "dw$sl $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -E "test result|FAILED|panicked" $R/nn.txt | head
for n in on off on2 off2; do echo "== $n"; grep -E "^(gpt2|matmul)" $R/rows-$n.txt $R/mm-$n.txt | grep " f16 " | awk '{print $1, $(NF-5)}' | sed 's/.*txt://' | tr '\n' ';'; echo; done
for sl in 16 32; do echo "== dw$sl"; grep -E "^gpt2" $R/dw-$sl.txt | grep " f16 " | awk '{print $1, $(NF-5)}' | tr '\n' ';'; echo; done
