#!/bin/bash
# Call 6: two-row dK dV with two query tiles of 32 in workgroup memory (WGTRAIN_EXP_KVDB,
# experimental; the next tile fetched at the first chunk, stored midway, one barrier a
# tile) against the default (tiles of 64, loaded between two barriers); profile and bench,
# each twice, interleaved; the attention tests with the experiment on.
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
run warm X=1
run default X=1
run db WGTRAIN_EXP_KVDB=1
run default2 X=1
run db2 WGTRAIN_EXP_KVDB=1
WGTRAIN_EXP_KVDB=1 WGTRAIN_TEST_ADAPTER=vulkan timeout 100 .carry/flash_test > $R/flash-test.txt 2>&1; echo "flash test (db) rc=$? $(( $(date +%s) - s0 ))s" >> $R/log.txt
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; awk '{print $1, $4, $5, $(NF-4), $(NF-3)}' $R/attn.txt; awk '{print $1,$2,$3,$8}' $R/bench.txt; cut -c1-140 $R/shader-stats.jsonl
