#!/bin/bash
# Tensor-core matmul: 16-byte operand loads as vec4<u32> (alignment 16) unpacked to f16
# when stashed (WGTRAIN_EXP_U8, experimental), against the H8 struct of two vec4<f16>
# (alignment 8; the default). 4096^3, 8192^3 and the GPT-2 rows, each twice,
# interleaved; the f16 matmul test with the experiment on.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
run() { # name, env...
  local n=$1; shift
  env "$@" timeout 150 $B bench --adapter vulkan --filter matmul_coop --json $R/mm-$n.json > $R/mm-$n.txt 2>&1
  env "$@" timeout 150 $B bench --adapter vulkan --filter gpt2. --json $R/rows-$n.json > $R/rows-$n.txt 2>&1
  echo "$n done $(( $(date +%s) - s0 ))s" >> $R/log.txt
}
run h8 X=1
run u8 WGTRAIN_EXP_U8=1
run h8b X=1
run u8b WGTRAIN_EXP_U8=1
WGTRAIN_EXP_U8=1 WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/nn_test > $R/nn-test.txt 2>&1; echo "nn test (u8) rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for n in h8 u8 h8b u8b; do echo "== $n"; grep -E "matmul_coop|f16 " $R/mm-$n.txt $R/rows-$n.txt | grep -v attention | awk '{print $1, $2, $(NF-5), $(NF-3)}'; done
tail -n 3 $R/nn-test.txt
