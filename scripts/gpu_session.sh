#!/usr/bin/env bash
# Everything one GPU call of a session measures, in one go, with PyTorch in the same
# call: the adapter's report (for `wgtrain estimate --described`), the GPT workloads'
# step times, peaks and estimates, lean torch.compile, attention and matmul rows against
# SDPA and cuBLAS, the gpt2 profiles, and the GPU numerics tests. Results go to OUT and
# into OUT/results.tar.gz.
#
# Here (no GPU): build and strip what the call needs into .carry/ and fetch the Vulkan
# loader's packages into .gl/ (shared/GPU.md):
#   scripts/gpu_session.sh prepare
# On the GPU machine (the `device` tool, carry [".gl", ".carry"]):
#   scripts/gpu_session.sh run "$OUT/r"
set -uo pipefail
cd "$(dirname "$0")/.."

prepare() {
    set -e
    cargo build --release --locked
    mkdir -p .carry .gl /tmp/amd64/partial
    grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo /.carry/ >> .git/info/exclude
    grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo /.gl/ >> .git/info/exclude
    strip -o .carry/wgtrain target/release/wgtrain
    # The GPU numerics tests, as a binary that runs without cargo.
    cargo test --release --locked --no-run --test flash_attention --message-format=json \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "flash_attention":
        print(m["executable"])' \
        | xargs -I{} strip -o .carry/flash_test {}
    local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    ls .gl/*.deb >/dev/null 2>&1 || {
        apt-get $o update -qq
        (cd .gl && apt-get $o download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
    }
    du -sh .carry .gl
}

run() {
    local out=$1 bin=.carry/wgtrain ref
    mkdir -p "$out"
    # shellcheck source=scripts/vulkan_loader.sh
    . scripts/vulkan_loader.sh
    ref=shared/reference; [ -d "$ref" ] || ref=../shared/reference
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
    "$bin" devices --json > "$out/devices.json" 2> "$out/devices.err"
    # Warm the GPU (a fresh machine idles at 345 MHz), then the kernels.
    "$bin" bench --adapter vulkan --filter matmul --json "$out/bench-matmul.json" > "$out/bench-matmul.txt" 2>&1
    "$bin" bench --adapter vulkan --filter flash_attention.fwd_bwd --json "$out/bench-attention.json" > "$out/bench-attention.txt" 2>&1
    python3 scripts/torch_kernels.py > "$out/torch-kernels.json" 2> "$out/torch-kernels.err"
    scripts/gpt_workloads.sh "$bin" "$out/wl" > "$out/workloads.txt" 2>&1
    rm -rf "$out/wl/data"
    python3 "$ref/torch_gpt2_lean_compiled.py" > "$out/torch-lean.txt" 2>&1
    scripts/profile_gpt_workloads.sh "$bin" "$out/profile" > "$out/profile.txt" 2>&1
    rm -rf "$out/profile/data"
    WGTRAIN_TEST_ADAPTER=vulkan .carry/flash_test --test-threads 1 > "$out/flash-test.txt" 2>&1
    echo "flash_test exit $?" >> "$out/flash-test.txt"
    tar -czf "$out/../results.tar.gz" -C "$out" .
}

case "${1:-}" in
    prepare) prepare ;;
    run) run "${2:?OUT directory}" ;;
    *) echo "usage: $0 prepare | run OUT" >&2; exit 2 ;;
esac
