#!/bin/bash
# Call 2 (probe): timed launches now share one compute pass (as a step's do). The fixed cost of a
# launch: one 128 x 128 tile with 1, 4 K tiles (no split), alone and 1/10/100 back to back; the
# short-K shapes of call 1 again; GPT-2's rows; cuBLAS at the small shapes.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
W=.carry/wgtrain
timeout 60 $W bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
SH="--matmul 128x64x128 --matmul 128x256x128 --matmul 1408x256x768 --matmul 2816x768x768 --matmul 5632x768x768 --matmul 8448x768x768 --matmul 16896x768x768 --matmul 8448x1536x768"
for L in 1 10 100; do
  timeout 120 $W bench --adapter vulkan $SH --launches $L --json $R/shapes-$L.json > $R/shapes-$L.txt 2>&1; log "shapes $L"
done
for L in 1 10; do
  timeout 120 $W bench --adapter vulkan --filter gpt2. --launches $L --json $R/gpt2-$L.json > $R/gpt2-$L.txt 2>&1; log "gpt2 $L"
done
cat > $R/cublas.py <<'PY'
import json, torch
torch.backends.cuda.matmul.allow_tf32 = False
out = []
for (m,k,n) in [(128,64,128),(128,256,128),(1408,256,768)]:
    a = torch.randn(m,k,device="cuda",dtype=torch.float16); b = torch.randn(k,n,device="cuda",dtype=torch.float16)
    for L in (1,10,100):
        for _ in range(20): a @ b
        torch.cuda.synchronize(); ts = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(L): a @ b
            e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3 / L)
        ts.sort(); us = ts[len(ts)//2]
        out.append({"shape":[m,k,n],"launches":L,"median_us":us})
print(json.dumps(out, indent=1))
PY
timeout 120 python3 $R/cublas.py > $R/cublas.json 2> $R/cublas.err; log "cublas"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for L in 1 10 100; do echo "== launches $L"; grep -E "^matmul" $R/shapes-$L.txt | sed 's/, /,/g' | awk '{print $3,$4,$5}'; done
for L in 1 10; do grep -E "^gpt2.*(fwd|dx|dw) " $R/gpt2-$L.txt | grep " f16 " | awk '{print $1, $(NF-5)}' | sed 's/gpt2.//' | tr '\n' ';'; echo; done
python3 -c "import json; [print(r) for r in json.load(open('$R/cublas.json'))]"
