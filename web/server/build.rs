//! Builds the dashboard's Leptos app (web/app) to wasm32 from source and runs
//! wasm-bindgen (as a library) on it; the server embeds the results from OUT_DIR.
//! The app has its own lock file and target folder (target/web-app): a nested cargo
//! on the outer build's target folder would wait forever on its lock.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let app = manifest_dir
        .join("../app")
        .canonicalize()
        .expect("web/app exists beside web/server");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for f in [
        "src",
        "Cargo.toml",
        "Cargo.lock",
        "index.html",
        "style.css",
        "../../record/src",
        "../../record/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", app.join(f).display());
    }
    let target_dir = manifest_dir.join("../../target/web-app");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--locked",
        "--target",
        "wasm32-unknown-unknown",
        "--manifest-path",
    ])
    .arg(app.join("Cargo.toml"))
    .arg("--target-dir")
    .arg(&target_dir);
    // The outer build's settings are for the host, not for the wasm build.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("cargo runs");
    if !status.success() {
        panic!(
            "building the dashboard app (web/app) for wasm32 failed; is the target installed? \
             (rustup target add wasm32-unknown-unknown; ./quickstart.sh does this)"
        );
    }
    let wasm = target_dir.join("wasm32-unknown-unknown/release/wgtrain_web_app.wasm");
    bindgen(&wasm, &out);
}

fn bindgen(wasm: &Path, out: &Path) {
    let mut b = wasm_bindgen_cli_support::Bindgen::new();
    b.input_path(wasm)
        .out_name("app")
        // The library's default differs from the CLI's: keep the default module path
        // so the generated JS finds app_bg.wasm beside itself, as the CLI's output does.
        .omit_default_module_path(false);
    b.web(true).expect("the web target is valid");
    b.generate(out).expect("wasm-bindgen processes the app");
}
