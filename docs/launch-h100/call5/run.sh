#!/bin/bash
# Call 5: the split-K second pass with vec4 partials (HEAD, wgtrain) against 585b657 (wgtrain_base,
# scalar second pass), GPT-2's dW rows interleaved, twice; the split-K matmul tests on the H100. And a
# diagnostic build (wgtrain_exp, not committed): with WGTRAIN_EXP_NOSTORE the direct-store tiles
# skip their stores (results wrong, rows fail their check; times only), so the epilogue's share
# of attn_proj's products and of the N = 768 shapes shows.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 .carry/wgtrain bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn split > $R/nn.txt 2>&1; log "nn rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn uneven >> $R/nn.txt 2>&1; log "nn2 rc=$?"
for n in base new base2 new2; do
  B=.carry/wgtrain; case $n in base*) B=.carry/wgtrain_base;; esac
  timeout 80 $B bench --adapter vulkan --filter .dw --json $R/dw-$n.json > $R/dw-$n.txt 2>&1; log $n
done
SH="--matmul 8448x768x768 --matmul 16896x768x768 --matmul 4096x4096x4096"
for n in store nostore store2 nostore2; do
  E=""; case $n in nostore*) E="WGTRAIN_EXP_NOSTORE=1";; esac
  env $E timeout 80 .carry/wgtrain_exp bench --adapter vulkan --filter gpt2.attn_proj --json $R/ap-$n.json > $R/ap-$n.txt 2>&1
  env $E timeout 80 .carry/wgtrain_exp bench --adapter vulkan $SH --json $R/sh-$n.json > $R/sh-$n.txt 2>&1; log $n
done
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -E "test result|FAILED|panicked" $R/nn.txt | head
for n in base new base2 new2; do echo "$n: $(grep -E '^gpt2' $R/dw-$n.txt | grep ' f16 ' | awk '{print $1, $(NF-5)}' | tr '\n' ';')"; done
for n in store nostore store2 nostore2; do echo "$n: $(grep -E '^(gpt2|matmul)' $R/ap-$n.txt $R/sh-$n.txt | grep ' f16 ' | sed 's/, /,/g' | awk '{print $1, $3, $4}' | sed 's|.*txt:||' | tr '\n' ';')"; done
