#!/usr/bin/env bash
# EXPERIMENT: time the attention kernels and two matmul tiles with parts of the WGSL cut out.
set -uo pipefail
out=$1; bin=.carry/wgtrain; mkdir -p $out
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
python3 scripts/make_token_data.py /tmp/data
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $out/gpu.txt 2>&1
sets="--set model.kind=\"gpt\" --set data.kind=\"tokens\" --set data.path=\"/tmp/data/gpt2\" --set model.vocab_size=50257 --set model.n_layer=2 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024 --set train.batch_size=8 --set memory.precision=\"fp16-mixed\" --set train.eval_every=1000000 --set data.eval_limit=8"
# warm
eval $bin bench --adapter vulkan --filter tune.2x2x4x4x32x1.matmul_coop > $out/warm.txt 2>&1
run_attn() { # name [patch]
  local n=$1; shift
  local s=$(date +%s.%N)
  if [ $# -gt 0 ]; then export WGTRAIN_PATCH=$PWD/$1; else unset WGTRAIN_PATCH; fi
  eval timeout 120 $bin profile --adapter vulkan $sets --steps 3 --warmup 2 > $out/$n.txt 2>&1
  echo "$n rc=$? $(echo "$(date +%s.%N) - $s" | bc) s" >> $out/log.txt
  grep flash_attention $out/$n.txt | sed "s/^/$n: /" >> $out/attn.txt
}
run_mm() {
  local n=$1; shift
  if [ $# -gt 0 ]; then export WGTRAIN_PATCH=$PWD/$1; else unset WGTRAIN_PATCH; fi
  timeout 120 $bin bench --adapter vulkan --tune --filter "tune.2x2x4x4x32x1.matmul_coop" --json $out/$n-slim.json > $out/$n-slim.txt 2>&1
  timeout 120 $bin bench --adapter vulkan --tune --filter "tune.2x4x4x2x64x1.matmul_coop" --json $out/$n-k64.json > $out/$n-k64.txt 2>&1
  echo "$n mm done" >> $out/log.txt
}
run_attn a00-base
for p in .carry/abl/a*.tsv; do run_attn $(basename $p .tsv) $p; done
run_attn a99-base
run_mm m00-base
for p in .carry/abl/m*.tsv; do run_mm $(basename $p .tsv) $p; done
unset WGTRAIN_PATCH
tar -czf $out/../r.tar.gz -C $out .
