#!/bin/bash
# Call E: ZeRO 1 and 2 with the weight all-gather through host vectors (new) against the
# build before it (mid, 7401803) and the session's starting build (old, 4194adb, zero 2 only).
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpus.txt
for b in mid new; do scripts/parallel_workloads.sh .carry/wgtrain-$b $R/$b z1 z2 2>&1 | grep '"run"' | sed "s/^/$b /"; done
scripts/parallel_workloads.sh .carry/wgtrain-old $R/old z2 2>&1 | grep '"run"' | sed "s/^/old /"
for d in $R/*; do [ -d $d ] && rm -f $d/*.memory.json $d/*.estimate.json; done
tar czf $OUT/r.tar.gz -C $OUT r
