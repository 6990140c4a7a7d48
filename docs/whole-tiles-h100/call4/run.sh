#!/bin/bash
# Call 4: the tensor-core matmul's operand loads without the shader's bounds check (WGTRAIN_EXP_UNCHECKED=1;
# every shape here is whole tiles) and from read-only bindings (WGTRAIN_EXP_READONLY=1), experimental; the
# driver's code for each; the nn test with read-only bindings.
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
run base X=1
run unchecked WGTRAIN_EXP_UNCHECKED=1
run readonly WGTRAIN_EXP_READONLY=1
run both WGTRAIN_EXP_UNCHECKED=1 WGTRAIN_EXP_READONLY=1
for n in unchecked readonly both; do
  case $n in unchecked) e="WGTRAIN_EXP_UNCHECKED=1";; readonly) e="WGTRAIN_EXP_READONLY=1";; both) e="WGTRAIN_EXP_UNCHECKED=1 WGTRAIN_EXP_READONLY=1";; esac
  env $e SHADER_DUMP=$R/sass-$n timeout 60 .carry/shader_stats "BK\", \"32\"), (\"NBUF\", \"1\"), (\"AHEAD\", \"1\")" > $R/stats-$n.jsonl 2>&1
  rm -f $R/sass-$n/*.wgsl
done
WGTRAIN_EXP_READONLY=1 WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/nn_test > $R/nn-test.txt 2>&1; echo "nn test (readonly) rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for n in base unchecked readonly both; do echo "== $n"; grep -E "matmul_coop|gpt2" $R/mm-$n.txt $R/rows-$n.txt | grep f16 | grep -v attention | awk '{print $1, $(NF-5)}' | sed 's|.*txt:||' | tr '\n' ' '; echo; done
grep -i error $R/*.txt | head -5; tail -n 3 $R/nn-test.txt
