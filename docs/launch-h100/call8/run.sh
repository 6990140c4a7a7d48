#!/bin/bash
# Call 8: the code as committed (PLAIN variants: whole tiles of a product with no epilogue stored
# without reading its parameters). The matmul tests on the H100; the matmul rows; GPT-2's rows
# (new-*) against wgtrain_prev (a803dbe: the epilogue read at every element), interleaved,
# twice; cuBLAS and SDPA in the same call; the GPT workloads (no checkpointing).
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
WGTRAIN_TEST_ADAPTER=vulkan timeout 200 .carry/kernels_nn > $R/nn.txt 2>&1; log "nn rc=$?"
timeout 100 $B bench --adapter vulkan --filter matmul --json $R/mm.json > $R/mm.txt 2>&1; log mm
for n in 1 2; do
  timeout 100 .carry/wgtrain_prev bench --adapter vulkan --filter gpt2. --json $R/prev-$n.json > $R/prev-$n.txt 2>&1
  timeout 100 $B bench --adapter vulkan --filter gpt2. --json $R/new-$n.json > $R/new-$n.txt 2>&1; log ab$n
done
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
CHECKPOINTS=none timeout 240 scripts/gpt_workloads.sh $B /tmp/wl > $R/workloads.txt 2>&1; log "workloads rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep -E "test result|FAILED|panicked" $R/nn.txt | head
grep -E "^(matmul|gpt2)" $R/mm.txt $R/new-1.txt $R/new-2.txt | grep -v "f32 " | awk '{print $1, $2, $(NF-5)}' | sed 's|.*txt:||' | tr '\n' ';'; echo
grep -E "^(matmul_f32|gpt2.flash)" $R/mm.txt $R/new-1.txt | awk '{print $1, $2, $(NF-5)}' | sed 's|.*txt:||' | tr '\n' ';'; echo
for f in prev-1 new-1 prev-2 new-2; do echo "$f: $(grep -E '^gpt2' $R/$f.txt | grep ' f16 ' | awk '{print $1, $(NF-5)}' | tr '\n' ';')"; done
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'gpt2' in r['kernel'] and ('attn' in r['kernel'] or 'qkv' in r['kernel'] or 'fc' in r['kernel']) or 'matmul' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
echo; grep run $R/workloads.txt
