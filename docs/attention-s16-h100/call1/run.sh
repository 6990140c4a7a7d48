#!/bin/bash
# Call 1: the tensor-core attention as it stands (eec2716): the driver's code of the three picked kernels,
# the attention row twice, and SDPA in the same call.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; B=.carry/wgtrain; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
for k in "Forward sg4.bc64.subgroup.prefetch" "KeyValue sg4.bc64.subgroup.direct" "Query sg4.bc64.subgroup.direct"; do
  n=$(echo $k | cut -d' ' -f1)
  SHADER_DUMP=$R/sass-$n timeout 60 .carry/shader_stats "flash_coop $k" >> $R/stats.jsonl 2>&1
  python3 scripts/sass_from_cache.py $R/sass-$n > $R/sass-$n.txt 2>&1
done
log sass
timeout 60 $B bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
for i in 1 2; do timeout 100 $B bench --adapter vulkan --filter gpt2.flash_attention --json $R/flash-$i.json > $R/flash-$i.txt 2>&1; done; log bench
timeout 200 python3 scripts/torch_kernels.py > $R/torch-kernels.json 2> $R/torch-err.txt; log "torch rc=$?"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt $R/stats.jsonl; grep flash $R/flash-*.txt
python3 -c "
import json
for r in json.load(open('$R/torch-kernels.json')):
    print(r['kernel'], r['dtype'], round(r['median_us'],1), end='; ')
"
# The device had no zstd, so the SASS came in two steps: the dumped pipeline caches were decompressed here
# (scripts/sass_from_cache.py's code_of on each cache's zstd frame), and the code sections disassembled on the
# device with /usr/local/cuda/bin/nvdisasm -b SM90: Forward.sass, KeyValue.sass, Query.sass. (The caches and
# the rendered WGSL, which the code at eec2716 makes again, are not kept.)
