#!/bin/bash
# Call 9: the gpt2 step profiled as committed (0cbe981), both precisions: `wgtrain profile`, 5 steps
# after 3 of warm-up, on random token files (scripts/make_token_data.py), as
# scripts/profile_gpt_workloads.sh sets them up.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R/data; cp .carry/REV $R/; B=.carry/wgtrain
python3 scripts/make_token_data.py $R/data > /dev/null
for p in fp16-mixed fp32; do
  timeout 150 $B profile --adapter vulkan --set model.kind='"gpt"' --set data.kind='"tokens"' --set data.path="\"$R/data/gpt2\"" \
    --set model.vocab_size=50257 --set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 \
    --set model.block_size=1024 --set train.batch_size=8 --set memory.precision="\"$p\"" \
    --set train.eval_every=1000000 --set data.eval_limit=8 --steps 5 --warmup 3 --json $R/gpt2-$p.profile.json > $R/gpt2-$p.profile.txt 2>&1
done
rm -rf $R/data; tar czf $OUT/r.tar.gz -C $OUT r
for p in fp16-mixed fp32; do head -30 $R/gpt2-$p.profile.txt; done
