#!/usr/bin/env bash
# The library's tests on the GPU machine: CI runs them on lavapipe only, and a GPU driver
# differs from it (tensor-core paths, subgroups of 32, its own rounding of fused
# multiply-adds and f16 conversions). The test binaries are built here, stripped and
# compressed (the carried files and the work tree must stay under 64 MiB together), and
# run there with WGTRAIN_TEST_ADAPTER=vulkan; the text corpus (fortunes) goes along,
# Fashion-MNIST (30 MB) does not, so the tests that train on it fail there with "not
# found".
#
# Here (no GPU), after `scripts/gpu_session.sh prepare` has fetched .gl/:
#   scripts/gpu_tests.sh prepare
# On the GPU machine (the `device` tool, carry [".gl", ".carry"]):
#   scripts/gpu_tests.sh run "$OUT"     (TESTS="bin bin:filter ..." picks; PER=seconds)
# It prints a line per binary and leaves $OUT/gpu-tests.tgz: each binary's failures and
# its list of tests.
set -uo pipefail
cd "$(dirname "$0")/.."
bins="kernels_nn kernels_map_reduce kernel_variants matmul_tails flash_attention
flash_attention_tiled_kv autograd_gradcheck layers convnets generate grad_scaler
allocator_gpu attention_memory memory_policies optim_schedule transformers_fixtures"

prepare() {
    set -e
    local dir=.carry/tests
    rm -rf "$dir" && mkdir -p "$dir"
    grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo /.carry/ >> .git/info/exclude
    cargo build --release --locked
    cargo test --release --locked --workspace --no-run --message-format=json \
        | python3 -c '
import json, sys
wanted = set(sys.argv[1].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and m["target"]["name"] in wanted:
        print(m["target"]["name"], m["executable"])' "$bins" \
        | while read -r name exe; do strip -o "$dir/$name" "$exe"; done
    strip -o "$dir/wgtrain" target/release/wgtrain
    xz -T0 -6 "$dir"/*
    # The tests name the checkout they were built in (fixtures, the wgtrain binary).
    pwd > "$dir/ROOT"
    tar -cJf "$dir/fortunes.tar.xz" -C / usr/share/games/fortunes
    du -sh "$dir"
}

# Once libtest has printed its result, waits for the process (timeout's child) to end;
# past 10 s it writes what each of its threads waits in, every 10 s, to FILE (a slow
# exit seen on the H200: 134-182 s after the tests had finished).
watch_exit() { # PID OUTPUT FILE
    local pid=$1 output=$2 file=$3 done_at= child
    while kill -0 "$pid" 2>/dev/null; do
        if [ -z "$done_at" ] && grep -q '^test result' "$output" 2>/dev/null; then
            done_at=$SECONDS
        fi
        if [ -n "$done_at" ] && [ $((SECONDS - done_at)) -ge 10 ] && [ $(((SECONDS - done_at) % 10)) -eq 0 ]; then
            child=$(cut -d" " -f1 /proc/"$pid"/task/"$pid"/children 2>/dev/null)
            {
                echo "--- $((SECONDS - done_at)) s after the result"
                for task in /proc/"${child:-$pid}"/task/*; do
                    echo "$(cat "$task/comm") $(cut -d' ' -f3 "$task/stat") wchan=$(cat "$task/wchan") syscall=$(cut -d' ' -f1 "$task/syscall" 2>/dev/null)"
                done
            } >> "$file" 2>&1
        fi
        sleep 1
    done
    [ -n "$done_at" ] && echo "exit $((SECONDS - done_at)) s after the result" >> "$file"
}

run() {
    local out=$1 logs=/tmp/gpu-tests bin=/tmp/gpu-test-bins root
    mkdir -p "$logs" "$bin"
    # shellcheck source=scripts/vulkan_loader.sh
    . scripts/vulkan_loader.sh
    export WGTRAIN_TEST_ADAPTER=vulkan
    root=$(cat .carry/tests/ROOT)
    [ -e "$root" ] || { mkdir -p "$(dirname "$root")"; ln -s "$PWD" "$root"; }
    tar -xJf .carry/tests/fortunes.tar.xz -C /
    for f in .carry/tests/*.xz; do
        [ "$f" = .carry/tests/fortunes.tar.xz ] && continue
        xz -dc "$f" > "$bin/$(basename "$f" .xz)"
        chmod +x "$bin/$(basename "$f" .xz)"
    done
    mkdir -p target/release && cp "$bin/wgtrain" target/release/wgtrain
    nvidia-smi --query-gpu=name,driver_version --format=csv > "$logs/gpu.txt" 2>&1
    local spec t filter start rc
    for spec in ${TESTS:-$bins}; do
        t=${spec%%:*}
        filter=
        [ "$spec" != "$t" ] && filter=${spec#*:}
        start=$SECONDS
        # shellcheck disable=SC2086
        timeout "${PER:-150}" "$bin/$t" $filter --test-threads "${THREADS:-4}" > "/tmp/$t.full" 2>&1 &
        watch_exit $! "/tmp/$t.full" "$logs/$t.exit.txt"
        wait $!
        rc=$?
        grep -v '^error: XDG' "/tmp/$t.full" | grep -A12 'panicked\|^failures:' | cut -c1-400 | head -150 > "$logs/$t.txt"
        grep '^test \|running for over' "/tmp/$t.full" | cut -c1-300 >> "$logs/$t.txt"
        [ -f "$logs/$t.exit.txt" ] && head -c 20000 "$logs/$t.exit.txt" >> "$logs/$t.txt"
        echo "$t exit $rc, $((SECONDS - start)) s: $(grep '^test result' "/tmp/$t.full" | tail -1)" | tee -a "$logs/summary.txt"
    done
    tar -czf "$out/gpu-tests.tgz" -C "$logs" .
}

case "${1:-}" in
    prepare) prepare ;;
    run) run "${2:?OUT directory}" ;;
    *) echo "usage: $0 prepare | run OUT" >&2; exit 2 ;;
esac
