#!/bin/bash
# Call C: the submitted code: host-vector test, host transfers, zero 0 / zero 3 against the previous build.
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpus.txt
WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/t-devices host_vectors uploads_and_downloads > $R/t-devices.txt 2>&1; grep "test result\|FAIL\|panicked" $R/t-devices.txt
for rep in 1 2; do
  echo "== xfer $rep"; timeout 120 .carry/host_transfer 0 1 > $R/xfer-$rep.txt 2>&1
  grep '"mode"' $R/xfer-$rep.txt | sed 's/"name": "[^"]*", //; s/_gb_s//g'
done
scripts/parallel_workloads.sh .carry/wgtrain-new $R/new single 2>&1 | grep '"run"' | sed "s/^/new /"
for b in new old; do scripts/parallel_workloads.sh .carry/wgtrain-$b $R/$b z0 z3 2>&1 | grep '"run"' | sed "s/^/$b /"; done
for d in $R/new $R/old; do rm -f $d/*.memory.json $d/*.estimate.json; done
tar czf $OUT/r.tar.gz -C $OUT r
