#!/bin/bash
# Call 2: workgroup memory zeroed (wgpu's default, as WebGPU requires) or not (WGTRAIN_EXP_NOZERO=1,
# experimental): the tensor-core matmul, the GPT-2 rows and the flash attention, interleaved, twice;
# the attention and nn tests without zeroing; the driver's code with native zeroing.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
run() { # name, env...
  local n=$1; shift
  env "$@" timeout 150 $B bench --adapter vulkan --filter matmul_coop --json $R/mm-$n.json > $R/mm-$n.txt 2>&1
  env "$@" timeout 200 $B bench --adapter vulkan --filter gpt2. --json $R/rows-$n.json > $R/rows-$n.txt 2>&1
  echo "$n done $(( $(date +%s) - s0 ))s" >> $R/log.txt
}
run zero X=1
run nozero WGTRAIN_EXP_NOZERO=1
run zerob X=1
run nozerob WGTRAIN_EXP_NOZERO=1
WGTRAIN_EXP_NOZERO=1 WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/flash_test > $R/flash-test.txt 2>&1; echo "flash test (nozero) rc=$?" >> $R/log.txt
WGTRAIN_EXP_NOZERO=1 WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/nn_test > $R/nn-test.txt 2>&1; echo "nn test (nozero) rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
SHADER_DUMP=$R/mm timeout 100 .carry/shader_stats "BK\", \"32\"), (\"NBUF\", \"1\"), (\"AHEAD\", \"1\")" > $R/stats-mm.jsonl 2> $R/stats-mm.err
rm -f $R/mm/*.wgsl
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for n in zero nozero zerob nozerob; do echo "== $n"; grep -E "matmul_coop|gpt2" $R/mm-$n.txt $R/rows-$n.txt | awk '{print $1, $2, $(NF-5)}' | sed 's|.*txt:||'; done
tail -n 3 $R/flash-test.txt $R/nn-test.txt
