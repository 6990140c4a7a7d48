#!/bin/bash
# Call 4: the forward at head size 128 against a known answer, per tile (examples/tmp_fa128, a diagnostic not
# kept); registers of every tile; the tile sweep with the smaller tiles (4x32, 4x16, 2x16) that let more
# workgroups share an SM's 64 KiB of workgroup memory (call 3).
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
timeout 100 .carry/tmp_fa128 > $R/fa128.txt 2>&1; log "fa128 rc=$?"
timeout 120 .carry/shader_stats "flash_coop" > $R/stats.jsonl 2>&1; log stats
timeout 60 .carry/wgtrain bench --adapter vulkan --filter gpt2.flash_attention > /dev/null 2>&1   # warm-up
timeout 300 .carry/wgtrain bench --adapter vulkan --tune --filter subgroup --json $R/tune.json > $R/tune.txt 2>&1; log tune
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt; cut -c1-300 $R/fa128.txt
python3 -c "
import json
for l in open('$R/stats.jsonl'):
    try: r=json.loads(l)
    except: continue
    if 'subgroup' in r['kernel']: print(r['kernel'], r.get('Register Count'), r.get('Shared Memory Size'))
"
grep -E "^tune" $R/tune.txt | awk '{print $1, $7}'
