#!/bin/bash
# Call 9: the committed code: the GPT workloads without checkpointing (step times, peaks against their
# estimates, losses), and the gpt2 fp16-mixed step profiled (5 steps after 3 of warm-up).
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R/data; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
CHECKPOINTS=none timeout 330 scripts/gpt_workloads.sh $B /tmp/wl > $R/workloads.txt 2>&1; log "workloads rc=$?"
python3 scripts/make_token_data.py $R/data > /dev/null
timeout 150 $B profile --adapter vulkan --set model.kind='"gpt"' --set data.kind='"tokens"' --set data.path="\"$R/data/gpt2\"" \
    --set model.vocab_size=50257 --set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 \
    --set model.block_size=1024 --set train.batch_size=8 --set memory.precision='"fp16-mixed"' \
    --set train.eval_every=1000000 --set data.eval_limit=8 --steps 5 --warmup 3 --json $R/gpt2-fp16-mixed.profile.json > $R/gpt2-fp16-mixed.profile.txt 2>&1
log "profile rc=$?"
rm -rf $R/data; tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; grep run $R/workloads.txt; head -14 $R/gpt2-fp16-mixed.profile.txt; grep flash_attention $R/gpt2-fp16-mixed.profile.txt; tail -3 $R/gpt2-fp16-mixed.profile.txt
