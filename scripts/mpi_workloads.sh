#!/usr/bin/env bash
# The MPI table of docs/performance.md: gpt2 fp32 (L12, C768, T1024) on random tokens,
# 8 examples per device, over the first two NVIDIA Vulkan adapters, in one process
# (parallel.devices) and over two MPI ranks (parallel.backend = "mpi", one process per
# device), for data parallel and for ZeRO 3 with both offloads and checkpointing; each
# run's log, its stderr with each rank's exchange timings (WGTRAIN_PARALLEL_TIMES=1),
# and a summary line per run. The MPI runs use `mpirun --bind-to none` (Open MPI binds
# each of two ranks to one core by default), then again through MPI's messages instead
# of the host's shared window, and bound to a core. Then PyTorch DDP over NCCL and over gloo at the same
# shapes (scripts/torch_gpt2_parallel.py).
# With ALLREDUCE=path/to/examples/mpi_allreduce, the exchange alone after them.
#   scripts/mpi_workloads.sh WGTRAIN_BINARY OUT_DIR
set -uo pipefail
bin=$1; out=$2; mkdir -p "$out/data"
here=$(dirname "$0")
python3 "$here/make_token_data.py" "$out/data"
"$bin" devices > "$out/devices.txt" 2>&1
idx=($(grep -E '^\[[0-9]+\].*NVIDIA.*vulkan' "$out/devices.txt" | sed -E 's/^\[([0-9]+)\].*/\1/'))
[ ${#idx[@]} -ge 2 ] || { echo "two NVIDIA Vulkan adapters needed; found: ${idx[*]}"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader PMIX_MCA_gds=hash
base=(--set model.kind='"gpt"' --set data.kind='"tokens"' --set data.path="\"$out/data/gpt2\"" --set model.vocab_size=50257
      --set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024
      --set train.steps=${STEPS:-9} --set train.eval_every=100000 --set data.eval_limit=8 --set memory.precision='"fp32"'
      --set train.batch_size=16 --set "parallel.devices=[${idx[0]},${idx[1]}]")
summary() { # tag
    python3 - "$out/$1.jsonl" "$1" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"mem"' in l]
later = sorted(s["step_ms"] for s in steps[2:])
ms = later[len(later) // 2]
print(json.dumps({"run": sys.argv[2], "median_step_ms": round(ms, 1), "samples_per_s": round(16 / ms * 1000, 1),
                  "peak_MiB": steps[-1]["mem"]["peak"] >> 20, "losses": [round(s["loss"], 4) for s in steps]}))
PY
}
run() { # tag, mpi (0/1), sets...
    local tag=$1 mpi=$2; shift 2
    if [ "$mpi" = 1 ]; then
        WGTRAIN_PARALLEL_TIMES=1 timeout 240 mpirun -n 2 ${BIND:---bind-to none} "$bin" train --quiet --log "$out/$tag.jsonl" "${base[@]}" --set parallel.backend='"mpi"' "$@" > "$out/$tag.txt" 2>&1
    else
        WGTRAIN_PARALLEL_TIMES=1 timeout 240 "$bin" train --quiet --log "$out/$tag.jsonl" "${base[@]}" "$@" > "$out/$tag.txt" 2>&1
    fi
    summary "$tag" || tail -5 "$out/$tag.txt"
}
run z0 0 --set parallel.zero=0
run z0-mpi 1 --set parallel.zero=0
WGTRAIN_MPI_SHARED_MEMORY=0 run z0-mpi-messages 1 --set parallel.zero=0
BIND="--bind-to core" run z0-mpi-bound 1 --set parallel.zero=0
run z3offp-ckpt 0 --set parallel.zero=3 --set parallel.offload='"optimizer+parameters"' --set memory.checkpoint='"every-layer"'
run z3offp-ckpt-mpi 1 --set parallel.zero=3 --set parallel.offload='"optimizer+parameters"' --set memory.checkpoint='"every-layer"'
MODES=ddp timeout 200 torchrun --standalone --nproc_per_node=2 "$here/torch_gpt2_parallel.py" 2>"$out/torch-nccl.err" | grep peer
BACKEND=gloo MODES=ddp timeout 200 torchrun --standalone --nproc_per_node=2 "$here/torch_gpt2_parallel.py" 2>"$out/torch-gloo.err" | grep peer
# The exchange alone: all-reduce bandwidth per rank against the ring bound through host
# memory (examples/mpi_allreduce), through the shared window and through messages.
if [ -x "${ALLREDUCE:-}" ]; then
    mpirun -n 2 --bind-to none "$ALLREDUCE" 4 25 100 400 > "$out/allreduce.jsonl" 2>&1
    WGTRAIN_MPI_SHARED_MEMORY=0 mpirun -n 2 --bind-to none "$ALLREDUCE" 4 25 100 400 >> "$out/allreduce.jsonl" 2>&1
    cat "$out/allreduce.jsonl"
fi
rm -rf "$out/data"
