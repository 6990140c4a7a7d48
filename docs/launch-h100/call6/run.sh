#!/bin/bash
# Call 6 (experiment build wgtrain_exp): how whole tiles store f32 C. direct: coopStoreT straight to
# C (as committed); staged: through the 16 x 16 staging area and the scalar epilogue; wide: through
# the staging area with 16-byte stores (WGTRAIN_EXP_STORE). Interleaved, twice: attn_proj's rows,
# the N = 768 shapes, 4096^3, and all GPT-2 rows for direct and wide. The f16 matmul tests with wide
# stores on the H100.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
W=.carry/wgtrain_exp
timeout 60 $W bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
WGTRAIN_EXP_STORE=wide WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn f16_matmul > $R/nn.txt 2>&1; log "nn rc=$?"
SH="--matmul 8448x768x768 --matmul 16896x768x768 --matmul 4096x4096x4096"
for n in direct staged wide direct2 staged2 wide2; do
  m=${n%2}
  WGTRAIN_EXP_STORE=$m timeout 80 $W bench --adapter vulkan --filter gpt2.attn_proj --json $R/ap-$n.json > $R/ap-$n.txt 2>&1
  WGTRAIN_EXP_STORE=$m timeout 80 $W bench --adapter vulkan $SH --json $R/sh-$n.json > $R/sh-$n.txt 2>&1; log $n
done
for n in direct wide; do
  WGTRAIN_EXP_STORE=$n timeout 100 $W bench --adapter vulkan --filter gpt2. --json $R/rows-$n.json > $R/rows-$n.txt 2>&1; log rows-$n
done
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -E "test result|FAILED|panicked" $R/nn.txt | head
for n in direct staged wide direct2 staged2 wide2; do echo "$n: $(grep -E '^(gpt2|matmul)' $R/ap-$n.txt $R/sh-$n.txt | grep ' f16 ' | sed 's/, /,/g' | awk '{print $1, $3, $4}' | sed 's|.*txt:||' | tr '\n' ';')"; done
for n in direct wide; do echo "$n: $(grep -E '^gpt2.*(fwd|dx|dw) ' $R/rows-$n.txt | grep ' f16 ' | awk '{print $1, $(NF-5)}' | sed 's/gpt2.//' | tr '\n' ';')"; done
