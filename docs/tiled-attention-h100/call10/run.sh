#!/bin/bash
# Call 10: the review commit (shared tile-loop functions): per-kernel profile, bench,
# SDPA, registers of the default tiles, attention tests.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
python3 scripts/make_token_data.py /tmp/data > /dev/null 2>&1
sets="--set model.kind=\"gpt\" --set data.kind=\"tokens\" --set data.path=\"/tmp/data/gpt2\" --set model.vocab_size=50257 --set model.n_layer=2 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024 --set train.batch_size=8 --set memory.precision=\"fp32\" --set train.eval_every=1000000 --set data.eval_limit=8"
for round in 1 2; do
  eval timeout 120 $B profile --adapter vulkan $sets --steps 3 --warmup 2 > $R/prof-$round.txt 2>&1
  grep flash_attention $R/prof-$round.txt | sed "s/^/$round: /" >> $R/attn.txt
  timeout 120 $B bench --adapter vulkan --filter flash_attention.fwd_bwd --json $R/bench-$round.json > $R/bench-$round.txt 2>&1
  grep fwd_bwd $R/bench-$round.txt | sed "s/^/$round: /" >> $R/bench.txt
done
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt
timeout 100 .carry/shader_stats "flash_tiled" 2>&1 | grep "prefetch: true } chunks 2" > $R/shader-stats.jsonl
WGTRAIN_TEST_ADAPTER=vulkan timeout 100 .carry/flash_test > $R/flash-test.txt 2>&1; echo "flash test rc=$?" >> $R/log.txt
WGTRAIN_TEST_ADAPTER=vulkan timeout 40 .carry/flash_kv_test > $R/flash-kv-test.txt 2>&1; echo "flash kv test rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; awk '{print $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14}' $R/attn.txt; cat $R/bench.txt; cut -c1-200 $R/shader-stats.jsonl
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'flash_attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1))
"
