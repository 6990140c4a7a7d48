#!/usr/bin/env bash
# wgtrain's quick start: `./quickstart.sh main` runs the main job (lists the GPUs, then
# trains the Fashion-MNIST MLP with the live dashboard on), `./quickstart.sh test` runs
# every test. Both install what a fresh Debian machine lacks first: a C linker, a Rust
# toolchain with the wasm32 target (the dashboard's app is built from source), Mesa's
# software Vulkan driver when wgpu finds no GPU, the datasets' Debian packages, and for
# the tests Chromium (the dashboard's browser test) and TensorBoard (its event files).
set -euo pipefail
cd "$(dirname "$0")"

say() { printf '\033[1m[quickstart]\033[0m %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else say "need root to run: $*"; exit 1
    fi
}

apt_updated=0
apt_install() {
    if ! command -v apt-get >/dev/null; then
        say "not a Debian system: please install $* yourself"; exit 1
    fi
    if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
    say "installing $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_toolchain() {
    command -v cc >/dev/null || apt_install gcc libc6-dev
    if ! command -v cargo >/dev/null; then
        if [ -x "$HOME/.cargo/bin/cargo" ]; then
            export PATH="$HOME/.cargo/bin:$PATH"
        else
            command -v curl >/dev/null || apt_install curl ca-certificates
            say "installing Rust (rustup, stable)"
            curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
            export PATH="$HOME/.cargo/bin:$PATH"
        fi
    fi
    if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
        say "adding the wasm32-unknown-unknown target (the dashboard's app)"
        rustup target add wasm32-unknown-unknown >&2
    fi
}

# Training across processes (parallel.backend = "mpi", on by default): Open MPI, and
# libclang for the binding's generated declarations; mpirun for the tests.
ensure_mpi() {
    local missing=()
    command -v mpirun >/dev/null || missing+=(openmpi-bin)
    command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
    if command -v dpkg >/dev/null; then
        dpkg -s libclang-dev >/dev/null 2>&1 || missing+=(libclang-dev)
    fi
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
}

# The dashboard's browser test drives Debian's Chromium.
ensure_browser() {
    command -v chromium >/dev/null || apt_install chromium chromium-driver
}

# TensorBoard's own reader checks the event files `train --tensorboard` writes: a Python
# virtual environment under target/ with the tensorboard package from PyPI.
ensure_tensorboard() {
    local venv=target/tensorboard-venv
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then return; fi
    command -v python3 >/dev/null || apt_install python3
    rm -rf "$venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        apt_install python3-venv
        rm -rf "$venv"; python3 -m venv "$venv"
    fi
    say "installing TensorBoard into $venv (its reader checks wgtrain's event files)"
    "$venv/bin/pip" install -q tensorboard >&2 ||
        say "could not install TensorBoard from PyPI: the event-file test will say so and fail"
}

# wgpu needs a native adapter (Vulkan, Metal or DX12); without a GPU, Mesa's lavapipe.
ensure_adapter() {
    local json
    json=$(./target/release/wgtrain devices --json 2>/dev/null || echo '[]')
    if ! grep -qE '"backend": "(vulkan|metal|dx12)"' <<<"$json"; then
        say "no native GPU adapter found; installing Mesa's software Vulkan driver"
        apt_install mesa-vulkan-drivers libvulkan1
    fi
}

# Datasets of the examples and tests, from Debian's packages.
ensure_datasets() {
    local missing=()
    [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || missing+=(dataset-fashion-mnist)
    [ -e /usr/share/games/fortunes/fortunes ] || missing+=(fortunes)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
}

build() {
    if [ -x target/release/wgtrain ]; then
        say "building wgtrain (release; only what changed)"
    else
        say "building wgtrain (release): a first build takes about 9 minutes on 2 cores, the last of them the dashboard's wasm app (wgtrain-web's build script)"
    fi
    cargo build --release --locked
}

# The tests' build: every test binary, and wgtrain itself as the tests build it (their
# dev-dependencies turn on other features of shared crates, so `cargo build` first would
# build much of the tree twice: 8.5 of a clean test run's 35 minutes on 2 cores).
build_tests() {
    say "building wgtrain and its tests (release): a first build takes about 15 minutes on 2 cores, 3 of them the dashboard's wasm app"
    cargo test --release --locked --workspace --no-run
}

case "${1:-}" in
    main)
        ensure_toolchain; ensure_mpi; build; ensure_adapter; ensure_datasets
        shift
        ./target/release/wgtrain devices
        mkdir -p runs
        exec ./target/release/wgtrain train examples/configs/fashion_mlp.toml --log runs/fashion_mlp.jsonl --overwrite --dashboard "$@"
        ;;
    test)
        ensure_toolchain; ensure_mpi; build_tests; ensure_adapter; ensure_datasets; ensure_browser
        ensure_tensorboard
        shift
        say "running every test"
        exec cargo test --release --locked --workspace "$@"
        ;;
    *)
        echo "usage: ./quickstart.sh main | test" >&2; exit 2
        ;;
esac
