#!/bin/bash
# Call 2: the peeled last K turn without the persistent launch (the kept code), twice; the 96 x 96
# candidate tiles at every GPT-2 product with split products in 2 K slices (WGTRAIN_EXP_SLICES=2),
# and the AHEAD tile with 2 slices beside them; the f16 matmul tests on the H100.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
B=.carry/wgtrain
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn f16_matmul > $R/nn.txt 2>&1
echo "nn $(( $(date +%s) - s0 ))s" >> $R/log.txt
for n in a b; do
  timeout 120 $B bench --adapter vulkan --filter gpt2. --json $R/rows-$n.json > $R/rows-$n.txt 2>&1
  timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 --json $R/mm-$n.json > $R/mm-$n.txt 2>&1
  echo "rows$n $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
for t in 3x2x2x3x64x1 3x2x2x3x64x1a2 2x2x3x3x64x1 2x3x3x2x32x2 2x4x4x2x64x1a2; do
  WGTRAIN_EXP_SLICES=2 timeout 100 $B bench --adapter vulkan --tune --filter tune.$t. --json $R/tune-$t.json > $R/tune-$t.txt 2>&1
  echo "$t $(( $(date +%s) - s0 ))s" >> $R/log.txt
done
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -E "test result|FAILED|panicked" $R/nn.txt | head
for n in a b; do echo "== $n"; grep -E "^(gpt2|matmul)" $R/rows-$n.txt $R/mm-$n.txt | grep " f16 " | awk '{print $1, $(NF-5)}' | sed 's/.*txt://' | tr '\n' ';'; echo; done
for t in 3x2x2x3x64x1 3x2x2x3x64x1a2 2x2x3x3x64x1 2x3x3x2x32x2 2x4x4x2x64x1a2; do echo "== $t"; grep -E "^tune" $R/tune-$t.txt | awk '{print $1, $(NF-5)}' | sed "s/tune.$t.//" | tr '\n' ';'; echo; done
