#!/bin/bash
# Call 1 (probe): where the time of a short-K tensor-core product goes. N = K = 768 products whose
# M gives 6, 132, 264, 396 and 792 workgroups of 128 x 128 (1, 1, 2, 3 and 6 waves of one per SM),
# K 768 / 1536 / 3072 at three waves, each timed alone from an idle device (--launches 1, as before)
# and 10 back to back (--launches 10); GPT-2's rows both ways; cuBLAS at the same shapes both ways.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
R=$OUT/r; mkdir -p $R; cp .carry/REV $R/; nvidia-smi -L > $R/gpu.txt; s0=$(date +%s)
log() { echo "$1 $(( $(date +%s) - s0 ))s" >> $R/log.txt; }
W=.carry/wgtrain
timeout 60 $W bench --adapter vulkan --filter matmul_coop_f16 > /dev/null 2>&1   # warm-up
SH="--matmul 128x768x768 --matmul 2816x768x768 --matmul 5632x768x768 --matmul 8448x768x768 --matmul 8192x768x768 --matmul 16896x768x768 --matmul 8448x1536x768 --matmul 8448x3072x768 --matmul 4096x4096x4096"
for L in 1 10; do
  timeout 120 $W bench --adapter vulkan $SH --launches $L --json $R/shapes-$L.json > $R/shapes-$L.txt 2>&1; log "shapes $L"
  timeout 120 $W bench --adapter vulkan --filter gpt2. --launches $L --json $R/gpt2-$L.json > $R/gpt2-$L.txt 2>&1; log "gpt2 $L"
done
cat > $R/cublas.py <<'PY'
import json, torch
torch.backends.cuda.matmul.allow_tf32 = False
out = []
shapes = [(128,768,768),(2816,768,768),(5632,768,768),(8448,768,768),(8192,768,768),(16896,768,768),(8448,1536,768),(8448,3072,768),(4096,4096,4096)]
for (m,k,n) in shapes:
    a = torch.randn(m,k,device="cuda",dtype=torch.float16); b = torch.randn(k,n,device="cuda",dtype=torch.float16)
    for L in (1,10):
        for _ in range(20): a @ b
        torch.cuda.synchronize(); ts = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(L): a @ b
            e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3 / L)
        ts.sort(); us = ts[len(ts)//2]
        out.append({"shape":[m,k,n],"launches":L,"median_us":us,"tflops":2*m*n*k/us/1e6})
# GPT-2's dW of attn_proj as ours: X^T (a view) @ dY, f16 out.
x = torch.randn(8192,768,device="cuda",dtype=torch.float16); dy = torch.randn(8192,768,device="cuda",dtype=torch.float16)
for L in (1,10):
    torch.cuda.synchronize(); ts=[]
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(L): x.t() @ dy
        e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e)*1e3/L)
    ts.sort(); us=ts[len(ts)//2]
    out.append({"shape":"attn_proj.dw","launches":L,"median_us":us,"tflops":2*768*768*8192/us/1e6})
print(json.dumps(out, indent=1))
PY
timeout 120 python3 $R/cublas.py > $R/cublas.json 2> $R/cublas.err; log "cublas"
tar czf $OUT/r.tar.gz -C $OUT r
cat $R/log.txt
for L in 1 10; do echo "== launches $L"; grep -E "^matmul" $R/shapes-$L.txt | awk '{print $3,$4,$5,$6,$7}'; grep -E "^gpt2.*(fwd|dx|dw) " $R/gpt2-$L.txt | grep " f16 " | awk '{print $1, $(NF-5), $(NF-3)}' | tr '\n' ';'; echo; done
python3 -c "import json; [print(r) for r in json.load(open('$R/cublas.json'))]"
