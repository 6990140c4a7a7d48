#!/bin/bash
# Call 7: the submitted code after review (each backward kernel chosen once). Bench (twice), SDPA, per-kernel profile, the attention
# tests, the fp32 GPT workloads.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
python3 scripts/make_token_data.py /tmp/data > /dev/null 2>&1
sets="--set model.kind=\"gpt\" --set data.kind=\"tokens\" --set data.path=\"/tmp/data/gpt2\" --set model.vocab_size=50257 --set model.n_layer=2 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024 --set train.batch_size=8 --set memory.precision=\"fp32\" --set train.eval_every=1000000 --set data.eval_limit=8"
eval timeout 120 $B profile --adapter vulkan $sets --steps 3 --warmup 2 > $R/prof.txt 2>&1
for i in 1 2; do
  timeout 120 $B bench --adapter vulkan --filter flash_attention.fwd_bwd --json $R/bench-$i.json > $R/bench-$i.txt 2>&1
done
echo "bench done $(( $(date +%s) - s0 ))s" >> $R/log.txt
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; echo "torch rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
WGTRAIN_TEST_ADAPTER=vulkan timeout 100 .carry/flash_test > $R/flash-test.txt 2>&1; echo "flash test rc=$?" >> $R/log.txt
WGTRAIN_TEST_ADAPTER=vulkan timeout 40 .carry/flash_kv_test > $R/flash-kv-test.txt 2>&1; echo "flash kv test rc=$?" >> $R/log.txt
PRECISIONS=fp32 CHECKPOINTS="none every-layer" timeout 200 scripts/gpt_workloads.sh $B /tmp/wl > $R/workloads.txt 2>&1; echo "workloads rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep flash_attention $R/prof.txt | awk '{print $1, $2, $3, $4, $(NF-4), $(NF-3)}'; grep -h fwd_bwd $R/bench-*.txt; grep run $R/workloads.txt
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'flash_attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1))
"
