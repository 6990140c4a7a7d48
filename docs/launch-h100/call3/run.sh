#!/bin/bash
# Call 3: uneven K slices on the tensor-core kernel. The f16 matmul tests on the H100 (uneven slices
# among them), then GPT-2's four dW products with the slices forced to 1-8 and 11 (--splits), f16
# and f32 rows (f32 only where equal slices fit).
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
W=.carry/wgtrain
timeout 60 $W bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn f16_matmul > $R/nn.txt 2>&1; log "nn rc=$?"
for S in 1 2 3 4 5 6 7 8 11; do
  timeout 100 $W bench --adapter vulkan --filter .dw --splits $S --json $R/dw-$S.json > $R/dw-$S.txt 2>&1; log "dw $S"
done
timeout 100 $W bench --adapter vulkan --filter .dw --json $R/dw-auto.json > $R/dw-auto.txt 2>&1; log "dw auto"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -E "test result|FAILED|panicked" $R/nn.txt | head
for S in 1 2 3 4 5 6 7 8 11 auto; do echo "== $S: $(grep -E '^gpt2' $R/dw-$S.txt | grep ' f16 ' | awk '{print $1, $(NF-5)}' | sed 's/gpt2.//' | tr '\n' ';')"; done
