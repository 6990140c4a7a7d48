#!/bin/bash
# Call 5: the two-ahead tile's first two K tiles fetched together (even K tiles into register set 0,
# odd into 1), against 9006653 (wgtrain_old: the last K turn on its own) and 69c1e6d (wgtrain_base: the
# session's start), interleaved, twice: GPT-2's rows and the tensor-core matmul rows; the f16 matmul
# tests on the H100.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 .carry/wgtrain bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn f16_matmul > $R/nn.txt 2>&1; log "nn rc=$?"
for n in base old new base2 old2 new2; do
  B=.carry/wgtrain; case $n in old*) B=.carry/wgtrain_old;; base*) B=.carry/wgtrain_base;; esac
  timeout 100 $B bench --adapter vulkan --filter gpt2. --json $R/rows-$n.json > $R/rows-$n.txt 2>&1
  timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 --json $R/mm-$n.json > $R/mm-$n.txt 2>&1; log $n
done
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -E "test result|FAILED|panicked" $R/nn.txt | head
for n in base old new base2 old2 new2; do echo "== $n"; grep -E "^(gpt2|matmul)" $R/rows-$n.txt $R/mm-$n.txt | grep " f16 " | grep -v attention | awk '{print $1, $(NF-5)}' | sed 's/.*txt://; s/gpt2.//' | tr '\n' ';'; echo; done
