#!/bin/bash
# Call B: old (before host vectors) against new, interleaved; one device; offload; the stage test on the H100.
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; pwd
for rep in 1 2; do
  for b in old new; do scripts/parallel_workloads.sh .carry/wgtrain-$b $R/$b-$rep z0 z3 2>&1 | grep '"run"' | sed "s/^/$b $rep /"; done
done
scripts/parallel_workloads.sh .carry/wgtrain-new $R/new-1 single 2>&1 | grep '"run"' | sed "s/^/new 1 /"
for b in new old; do scripts/parallel_workloads.sh .carry/wgtrain-$b $R/$b-1 z3offp-ckpt 2>&1 | grep '"run"' | sed "s/^/$b 1 /"; done
exe=/work/main/target/release/wgtrain; echo "test binary wants $exe"
[ -e "$exe" ] || { mkdir -p $(dirname $exe) && cp .carry/wgtrain-new $exe; }
WGTRAIN_TEST_ADAPTER=vulkan timeout 100 .carry/t-parallel every_zero_stage > $R/t-parallel.txt 2>&1; grep "test result\|FAIL\|panicked" $R/t-parallel.txt
for d in $R/*-[12]; do rm -f $d/*.memory.json $d/*.estimate.json; done
tar czf $OUT/r.tar.gz -C $OUT r
