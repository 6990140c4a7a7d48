#!/bin/bash
# Call 1: what the driver makes of the tensor-core matmul and attention: pipeline cache data and internal representations, disassembled.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; nvidia-smi -L > $R/gpu.txt
ls $(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))")/backends/nvidia/bin > $R/tools.txt 2>&1
which nvdisasm cuobjdump >> $R/tools.txt 2>&1
SHADER_DUMP=$R/mm timeout 200 .carry/shader_stats matmul_coop > $R/stats-mm.jsonl 2> $R/stats-mm.err
SHADER_DUMP=$R/fa timeout 200 .carry/shader_stats "flash_coop" > $R/stats-fa.jsonl 2> $R/stats-fa.err
python3 scripts/sass_from_cache.py $R/mm > $R/sass-mm.txt 2>&1
python3 scripts/sass_from_cache.py $R/fa > $R/sass-fa.txt 2>&1
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/tools.txt; head -c 600 $R/stats-mm.err; head -30 $R/sass-mm.txt; ls $R/mm | head -30; du -sh $R
