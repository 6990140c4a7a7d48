#!/bin/bash
# Call 6: the two-ahead tile's last turn without a fetch (not clamped), the tiled f32 matmul unchecked only
# with both operands' rows contiguous; char fp16-mixed against the binary before (wgtrain_old, 62014f8),
# with per-kernel profiles; the matmul and GPT-2 rows; the workloads; the nn test.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 60 .carry/wgtrain bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
sets="--set model.kind=\"gpt\" --set data.kind=\"tokens\" --set data.path=\"/tmp/wl/data/char\" --set model.vocab_size=65 --set model.n_layer=6 --set model.n_head=6 --set model.n_embd=384 --set model.block_size=256 --set train.batch_size=64 --set memory.precision=\"fp16-mixed\" --set train.eval_every=1000000 --set data.eval_limit=8"
for b in old new old2 new2; do
  B=.carry/wgtrain; case $b in old*) B=.carry/wgtrain_old;; esac
  PRECISIONS=fp16-mixed WORKLOADS=char CHECKPOINTS=none timeout 100 scripts/gpt_workloads.sh $B /tmp/wl > $R/char-$b.txt 2>&1
  case $b in old|new) eval timeout 100 $B profile --adapter vulkan $sets --steps 3 --warmup 2 > $R/prof-char-$b.txt 2>&1;; esac
  log "char $b"
done
B=.carry/wgtrain
timeout 150 $B bench --adapter vulkan --filter matmul --json $R/mm.json > $R/mm.txt 2>&1
timeout 200 $B bench --adapter vulkan --filter gpt2. --json $R/rows.json > $R/rows.txt 2>&1; log "bench"
WGTRAIN_TEST_ADAPTER=vulkan timeout 120 .carry/nn_test > $R/nn-test.txt 2>&1; log "nn test rc=$?"
CHECKPOINTS=none WORKLOADS=gpt2 timeout 200 scripts/gpt_workloads.sh $B /tmp/wl > $R/workloads.txt 2>&1; log "workloads rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
grep -h run $R/char-*.txt
for b in old new; do echo "== $b"; sed -n 1,16p $R/prof-char-$b.txt | cut -c1-120; done
grep -E "^(matmul|gpt2)" $R/mm.txt $R/rows.txt | awk '{print $1, $2, $(NF-5)}' | sed 's|.*txt:||' | tr '\n' ';'; echo
grep run $R/workloads.txt; tail -n 2 $R/nn-test.txt
