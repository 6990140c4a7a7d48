#!/bin/bash
# Call 3: the device with robust buffer access (wgpu's default) or without (WGTRAIN_EXP_NOROBUST=1, experimental):
# the tensor-core matmul, the GPT-2 rows and the flash attention, interleaved, twice;
# the attention and nn tests without it; the driver's code without it (SHADER_ROBUST=0).
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
run robust X=1
run norobust WGTRAIN_EXP_NOROBUST=1
run robustb X=1
run norobustb WGTRAIN_EXP_NOROBUST=1
WGTRAIN_EXP_NOROBUST=1 WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/flash_test > $R/flash-test.txt 2>&1; echo "flash test (norobust) rc=$?" >> $R/log.txt
WGTRAIN_EXP_NOROBUST=1 WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/nn_test > $R/nn-test.txt 2>&1; echo "nn test (norobust) rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
SHADER_ROBUST=0 SHADER_DUMP=$R/mm timeout 100 .carry/shader_stats "BK\", \"32\"), (\"NBUF\", \"1\"), (\"AHEAD\", \"1\")" > $R/stats-mm.jsonl 2> $R/stats-mm.err
SHADER_ROBUST=0 SHADER_DUMP=$R/fa timeout 100 .carry/shader_stats "flash_coop" > $R/stats-fa.jsonl 2> $R/stats-fa.err
SHADER_DUMP=$R/fa1 timeout 100 .carry/shader_stats "flash_coop" > $R/stats-fa1.jsonl 2> $R/stats-fa1.err
rm -f $R/mm/*.wgsl $R/fa1/*.wgsl
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for n in robust norobust robustb norobustb; do echo "== $n"; grep -E "matmul_coop|gpt2" $R/mm-$n.txt $R/rows-$n.txt | awk '{print $1, $2, $(NF-5)}' | sed 's|.*txt:||'; done
tail -n 3 $R/flash-test.txt $R/nn-test.txt
