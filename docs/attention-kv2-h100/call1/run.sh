#!/bin/bash
# Call 1: lane dK dV with two key rows a thread (default), against one key row
# (kv=lane) and against the same kernel as loops (WGTRAIN_EXP_KVLOOP, an experimental
# knob since removed); the tiled dQ with the row dot folded in. Per-kernel profile,
# bench, SDPA, registers, attention tests.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
python3 scripts/make_token_data.py /tmp/data > /dev/null 2>&1
sets="--set model.kind=\"gpt\" --set data.kind=\"tokens\" --set data.path=\"/tmp/data/gpt2\" --set model.vocab_size=50257 --set model.n_layer=2 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024 --set train.batch_size=8 --set memory.precision=\"fp32\" --set train.eval_every=1000000 --set data.eval_limit=8"
run() { # name, env...
  local n=$1; shift
  eval env "$@" timeout 120 $B profile --adapter vulkan $sets --steps 3 --warmup 2 > $R/prof-$n.txt 2>&1
  grep flash_attention $R/prof-$n.txt | sed "s/^/$n: /" >> $R/attn.txt
  env "$@" timeout 120 $B bench --adapter vulkan --filter flash_attention.fwd_bwd --json $R/bench-$n.json > $R/bench-$n.txt 2>&1
  grep fwd_bwd $R/bench-$n.txt | sed "s/^/$n: /" >> $R/bench.txt
  echo "$n done $(( $(date +%s) - s0 ))s" >> $R/log.txt
}
run kv2 X=1
run lane WGTRAIN_TILED_ATTENTION=kv=lane
run kv2loop WGTRAIN_EXP_KVLOOP=1
run kv2b X=1
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt
timeout 100 .carry/shader_stats "flash_simt" 2>&1 | grep "dK dV\|dQ" > $R/shader-stats.jsonl
WGTRAIN_TEST_ADAPTER=vulkan timeout 100 .carry/flash_test > $R/flash-test.txt 2>&1; echo "flash test rc=$?" >> $R/log.txt
WGTRAIN_TEST_ADAPTER=vulkan timeout 40 .carry/flash_kv_test > $R/flash-kv-test.txt 2>&1; echo "flash kv test rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; awk '{print $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14}' $R/attn.txt; cat $R/bench.txt; cut -c1-220 $R/shader-stats.jsonl
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    if 'flash_attention' in r['kernel']: print(r['kernel'], r['dtype'], round(r['median_us'],1))
"
