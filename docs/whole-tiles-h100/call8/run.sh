#!/bin/bash
# Call 8: the committed code (65a74a1): matmul and GPT-2 rows, cuBLAS and SDPA in the same call, the nn and
# attention tests, the GPT workloads (no checkpointing), the gpt2 fp16-mixed profile, and the driver's code of
# the 128-thread tile with and without the bounds checks.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 $B bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
timeout 150 $B bench --adapter vulkan --filter matmul --json $R/mm.json > $R/mm.txt 2>&1
timeout 200 $B bench --adapter vulkan --filter gpt2. --json $R/rows.json > $R/rows.txt 2>&1; log "bench"
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/nn_test > $R/nn-test.txt 2>&1; log "nn test rc=$?"
WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/flash_test > $R/flash-test.txt 2>&1; log "flash test rc=$?"
CHECKPOINTS=none timeout 200 scripts/gpt_workloads.sh $B /tmp/wl > $R/workloads.txt 2>&1; log "workloads rc=$?"
sets="--set model.kind=\"gpt\" --set data.kind=\"tokens\" --set data.path=\"/tmp/wl/data/gpt2\" --set model.vocab_size=50257 --set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024 --set train.batch_size=8 --set memory.precision=\"fp16-mixed\" --set train.eval_every=1000000 --set data.eval_limit=8"
eval timeout 100 $B profile --adapter vulkan $sets --steps 3 --warmup 2 > $R/profile-gpt2-fp16-mixed.txt 2>&1; log "profile rc=$?"
SHADER_DUMP=$R/sass timeout 60 .carry/shader_stats '("GM", "2"), ("GN", "2"), ("FM", "4"), ("FN", "4"), ("BK", "32"), ("NBUF", "1"), ("AHEAD", "1")' > $R/stats-slim.jsonl 2>&1; rm -f $R/sass/*.wgsl
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
grep -E "^(matmul|gpt2)" $R/mm.txt $R/rows.txt | awk '{print $1, $2, $(NF-5)}' | sed 's|.*txt:||' | tr '\n' ';'; echo
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
echo; grep run $R/workloads.txt; tail -n 2 $R/nn-test.txt $R/flash-test.txt; tail -n 1 $R/profile-gpt2-fp16-mixed.txt
