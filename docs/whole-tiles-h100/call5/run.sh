#!/bin/bash
# Call 5: whole tiles loaded without bounds checks (tensor-core matmul, tiled f32 matmul, tensor-core
# attention): the matmul rows and GPT-2's rows (twice), cuBLAS and SDPA in the same call, the nn and
# attention tests, the GPT workloads (no checkpointing, both policies).
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
for i in 1 2; do
  timeout 150 $B bench --adapter vulkan --filter matmul --json $R/mm-$i.json > $R/mm-$i.txt 2>&1
  timeout 200 $B bench --adapter vulkan --filter gpt2. --json $R/rows-$i.json > $R/rows-$i.txt 2>&1
  log "bench $i"
done
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/nn_test > $R/nn-test.txt 2>&1; log "nn test rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
CHECKPOINTS=none timeout 240 scripts/gpt_workloads.sh $B /tmp/wl > $R/workloads.txt 2>&1; log "workloads rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for i in 1 2; do echo "== $i"; grep -E "^(matmul|gpt2)" $R/mm-$i.txt $R/rows-$i.txt | awk '{print $1, $2, $(NF-5)}' | sed 's|.*txt:||' | tr '\n' ';'; echo; done
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
echo; grep run $R/workloads.txt; tail -n 2 $R/nn-test.txt $R/flash-test.txt
