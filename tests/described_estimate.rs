//! Estimates for a described adapter (`wgtrain estimate --described FILE`): a stand-in
//! built from this machine's own report estimates exactly what the adapter itself does;
//! one built from an H100's report picks the H100's kernels (cooperative matrices, which
//! lavapipe cannot compile) without compiling them; bad descriptions are clear errors;
//! and the estimate names what is alive at its peak.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use wgtrain_engine::device::described::read_description;
use wgtrain_engine::device::{self, DeviceError, Gpu};
use wgtrain_engine::memory::AllocatorOptions;
use wgtrain_engine::runtime::Runtime;
use wgtrain_engine::train::Config;
use wgtrain_engine::train::plan::{estimate, estimate_with};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgtrain-described-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The char GPT example, small, with gradients through every kind of layer.
fn char_gpt(precision: &str, checkpoint: &str) -> Config {
    let sets: Vec<String> = [
        "model.n_layer=2".to_string(),
        "model.n_embd=64".into(),
        "model.n_head=4".into(),
        "model.block_size=64".into(),
        "train.batch_size=4".into(),
        format!("memory.precision=\"{precision}\""),
        format!("memory.checkpoint=\"{checkpoint}\""),
    ]
    .into();
    Config::load(Some(&root().join("examples/configs/char_gpt.toml")), &sets).unwrap()
}

#[test]
fn a_stand_in_for_this_adapter_estimates_exactly_what_the_adapter_does() {
    // The report of the adapter `Gpu::open(None)` picks, as `wgtrain devices --json`
    // writes it, read back from a file.
    let opened = Gpu::open(None).unwrap();
    let dir = temp("self");
    let file = dir.join("devices.json");
    std::fs::write(&file, serde_json::to_string_pretty(&device::list_adapters()).unwrap()).unwrap();
    let described = read_description(&file, Some(&opened.report.index.to_string())).unwrap();
    assert_eq!(described, opened.report);
    drop(opened);
    for precision in ["fp32", "fp16-mixed"] {
        for checkpoint in ["none", "every-layer"] {
            let (real, _) = estimate(char_gpt(precision, checkpoint), None).unwrap();
            let stand_in = Arc::new(Gpu::stand_in(described.clone(), None).unwrap());
            let (est, _) = estimate_with(char_gpt(precision, checkpoint), stand_in).unwrap();
            let what = format!("{precision}, checkpointing {checkpoint}");
            assert_eq!(est.peak_bytes, real.peak_bytes, "{what}");
            assert_eq!(est.peak_reserved_bytes, real.peak_reserved_bytes, "{what}");
            assert_eq!(est.by_category, real.by_category, "{what}");
            assert_eq!(est.at_peak, real.at_peak, "{what}");
        }
    }
}

#[test]
fn an_h100_stand_in_takes_its_tensor_core_kernels_without_compiling_them() {
    let file = root().join("tests/fixtures/devices-h100.json");
    let h100 = read_description(&file, Some("vulkan")).unwrap();
    assert!(h100.name.contains("H100"), "{}", h100.name);
    let gpu = Arc::new(Gpu::stand_in(h100, None).unwrap());
    assert!(gpu.stand_in);
    assert!(gpu.caps.coop_f16_16x16x16(), "the description grants 16x16x16 f16 -> f32");
    assert_eq!(gpu.caps.subgroup_size, (32, 32));
    assert_eq!(gpu.caps.limits.max_storage_buffer_binding_size, 2147483644);
    // fp16-mixed on the H100 runs its matmuls and attention on cooperative matrices:
    // this machine's adapter could not compile them, so the stand-in must not try.
    let (est, _) = estimate_with(char_gpt("fp16-mixed", "none"), gpu.clone()).unwrap();
    assert!(est.peak_bytes > 0);
    // A model whose embedding exceeds lavapipe's 128 MiB binding fits the H100's 2 GiB.
    let dir = temp("tokens");
    let ids: Vec<u8> = (0..4096u32).flat_map(|i| ((i * 7919 % 50257) as u16).to_le_bytes()).collect();
    for split in ["train.bin", "val.bin"] {
        std::fs::write(dir.join(split), &ids).unwrap();
    }
    let big: Vec<String> = vec![
        "model.kind=\"gpt\"".into(),
        "data.kind=\"tokens\"".into(),
        format!("data.path=\"{}\"", dir.display()),
        "model.vocab_size=50257".into(),
        "model.n_layer=1".into(),
        "model.n_embd=768".into(),
        "model.n_head=12".into(),
        "model.block_size=64".into(),
        "train.batch_size=2".into(),
        "memory.precision=\"fp32\"".into(),
    ];
    let big = Config::load(None, &big).unwrap();
    let wte = 50257 * 768 * 4;
    if Gpu::open(None).unwrap().caps.limits.max_storage_buffer_binding_size < wte {
        let err = estimate(big.clone(), None).expect_err("too big for this adapter's bindings");
        assert!(err.to_string().contains("larger than one buffer binding"), "{err}");
    }
    let (est, _) = estimate_with(big, gpu.clone()).unwrap();
    assert!(est.by_category["parameter"] >= wte, "{:?}", est.by_category);
    // It keeps books only: a runtime that would run kernels is refused.
    let err = Runtime::new(gpu, AllocatorOptions::default()).err().expect("refused");
    assert!(err.to_string().contains("stand-in"), "{err}");
}

#[test]
fn bad_descriptions_are_clear_errors() {
    let dir = temp("bad");
    let cases: [(&str, &str); 4] = [
        ("not json", "not JSON"),
        ("[{\"index\": 0}]", "not a `wgtrain devices --json` report"),
        ("[]", "no GPU adapter"),
        // An H100 report written before reports gave subgroup sizes.
        (include_str!("fixtures/devices-h100-no-subgroups.json"), "does not give their size"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let file = dir.join(format!("d{i}.json"));
        std::fs::write(&file, text).unwrap();
        let err = read_description(&file, Some("vulkan")).unwrap_err();
        assert!(err.to_string().contains(expected), "case {i}: {err}");
    }
    let missing = read_description(&dir.join("none.json"), None).unwrap_err();
    assert!(matches!(missing, DeviceError::Description { .. }), "{missing}");
    // A selector that names no adapter of the file.
    let file = root().join("tests/fixtures/devices-h100.json");
    let err = read_description(&file, Some("metal")).unwrap_err();
    assert!(matches!(err, DeviceError::NoMatch { .. }), "{err}");
}

#[test]
fn the_plain_estimate_says_whether_the_adapter_holds_the_peak() {
    // This machine's adapter, and the same adapter described with 4 MiB of memory.
    let small = temp("small-adapter").join("devices.json");
    let text = std::fs::read_to_string(root().join("tests/fixtures/devices-lavapipe.json")).unwrap();
    std::fs::write(&small, text.replace("\"memory_bytes\": 2147483648", "\"memory_bytes\": 4194304")).unwrap();
    for (described, fits) in [(None, true), (Some(&small), false)] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgtrain"));
        cmd.args(["estimate", "--set", "data.train_limit=384"]);
        if let Some(file) = described {
            cmd.arg("--described").arg(file);
        }
        let table = cmd.output().unwrap();
        assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
        let text = String::from_utf8_lossy(&table.stdout);
        let json = cmd.arg("--json").output().unwrap();
        let e: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        let (reserved, memory) = (
            e["peak_reserved_bytes"].as_u64().unwrap(),
            e["device_memory_bytes"].as_u64().unwrap(),
        );
        assert_eq!(e["fits_device"].as_bool(), Some(fits), "{e}");
        assert_eq!(reserved <= memory, fits, "{reserved} reserved, {memory} memory");
        if fits {
            assert!(text.contains("fits this adapter's 2.00 GiB"), "{text}");
        } else {
            assert!(
                text.contains("does NOT fit this adapter's 4.00 MiB") && text.contains("--memory 4.00MiB"),
                "{text}"
            );
        }
    }
}

#[test]
fn the_cli_estimates_for_a_described_adapter_and_names_what_fills_the_peak() {
    let out = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["estimate", "--json", "--described"])
        .arg(root().join("tests/fixtures/devices-h100.json"))
        .arg(root().join("examples/configs/char_gpt.toml"))
        .args(["--set", "model.n_layer=2", "--set", "train.batch_size=4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("H100"));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let peak = e["peak_bytes"].as_u64().unwrap();
    let view = &e["at_peak"];
    assert_eq!(view["peak_bytes"].as_u64(), Some(peak));
    let blocks = view["blocks"].as_array().unwrap();
    let sum: u64 = blocks.iter().map(|b| b["size"].as_u64().unwrap()).sum();
    assert_eq!(sum, peak, "the blocks alive at the peak add up to it");
    assert!(blocks.iter().any(|b| b["category"] == "parameter"));
    assert!(blocks.iter().any(|b| b["category"] == "activation"));
    let sizes: Vec<u64> = blocks.iter().map(|b| b["size"].as_u64().unwrap()).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest first");
}

#[test]
fn the_estimate_table_lists_the_largest_blocks_at_the_peak() {
    let out = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["estimate"])
        .arg(root().join("examples/configs/char_gpt.toml"))
        .args(["--set", "model.n_layer=2", "--set", "train.batch_size=4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("blocks alive at the peak"))
        .skip(1)
        .collect();
    assert_eq!(listed.len(), 8, "{text}");
    // Its peak is in backward: the saved activations are among the largest blocks.
    assert!(listed.iter().any(|l| l.contains("activation") && l.contains("(forward)")), "{text}");
    assert!(listed.iter().all(|l| l.contains('(') && l.ends_with(')')), "{text}");
}

/// `wgtrain estimate --memory SIZE` on the small char GPT, JSON.
fn will_it_fit(size: &str, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["estimate", "--json", "--memory", size])
        .arg(root().join("examples/configs/char_gpt.toml"))
        .args(["--set", "model.n_layer=2", "--set", "train.batch_size=16"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn will_it_fit_says_by_how_much_and_the_change_that_fits() {
    let roomy = will_it_fit("1GiB", &[]);
    assert_eq!(roomy["fits"], true);
    let need = roomy["estimate"]["peak_reserved_bytes"].as_u64().unwrap();
    // One byte short: does not fit, and a single change that does is named, with an
    // estimate under the size.
    let short = will_it_fit(&(need - 1).to_string(), &[]);
    assert_eq!(short["fits"], false);
    assert_eq!(
        short["estimate"]["peak_reserved_bytes"].as_u64(),
        Some(need),
        "the same run, the same estimate"
    );
    let change = &short["change_that_fits"];
    assert!(change["change"].as_str().is_some_and(|c| !c.is_empty()), "{short}");
    assert!(change["peak_reserved_bytes"].as_u64().unwrap() < need);
    // Each option's verdict agrees with its estimate.
    for o in short["what_if"].as_array().unwrap() {
        assert_eq!(o["fits"].as_bool(), Some(o["peak_reserved_bytes"].as_u64().unwrap() < need), "{o}");
    }
    // A model this machine's adapter cannot bind (a 144 MiB activation on lavapipe's 128
    // MiB bindings) is still estimated for a device of that size.
    let big = will_it_fit(
        "8GiB",
        &[
            "--set",
            "model.n_embd=768",
            "--set",
            "model.n_head=12",
            "--set",
            "model.block_size=1024",
            "--set",
            "train.batch_size=8",
            "--set",
            "model.vocab_size=50257",
            "--set",
            "data.eval_limit=8",
        ],
    );
    assert!(
        big["estimate"]["peak_reserved_bytes"].as_u64().unwrap() > 1 << 30,
        "{}",
        big["estimate"]["peak_reserved_bytes"]
    );
    // A fraction is refused: there is no device to take it of.
    let out = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["estimate", "--memory", "0.5"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not a fraction"));
}

#[test]
fn what_if_on_several_devices_offers_sharding_and_the_two_activation_savers_together() {
    let out = will_it_fit("1GiB", &["--set", "parallel.devices=[\"0\", \"0\"]"]);
    let options = out["what_if"].as_array().unwrap();
    let find = |change: &str| {
        options
            .iter()
            .find(|o| o["change"] == change)
            .unwrap_or_else(|| panic!("no '{change}' in {options:?}"))
    };
    let run = find("");
    let peak = |o: &serde_json::Value| o["peak_bytes"].as_u64().unwrap();
    let zero3 = find("parallel.zero = 3");
    let offload = find("parallel.zero = 3, parallel.offload = optimizer+parameters");
    let both = find("memory.precision = fp16-mixed, memory.checkpoint = every-layer");
    // Micro-batches split each device's share (8 of the 16): half of it saves memory.
    assert_eq!(run["policy"]["micro_batch_size"], 8, "each device's share: {run}");
    let half = find("train.micro_batch_size = 4");
    assert!(peak(half) < peak(run), "{half} vs {run}");
    // Sharding moves state off each device; offloading moves the rest of it to the host;
    // the two activation savers together beat either alone.
    assert!(peak(zero3) < peak(run), "{zero3} vs {run}");
    assert!(peak(offload) < peak(zero3), "{offload} vs {zero3}");
    assert_eq!(zero3["policy"]["zero"], 3);
    assert_eq!(offload["policy"]["offload"], "optimizer+parameters");
    for alone in ["memory.precision = fp16-mixed", "memory.checkpoint = every-layer"] {
        assert!(peak(both) < peak(find(alone)), "{both} vs {alone}");
    }
}

/// `wgtrain estimate --json` of a small token GPT reading `path` (`extra` appended).
fn token_estimate(path: &Path, extra: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["estimate", "--json"])
        .args(["--set", "model.kind=\"gpt\"", "--set", "data.kind=\"tokens\""])
        .args(["--set", &format!("data.path=\"{}\"", path.display())])
        .args(["--set", "model.n_layer=2", "--set", "model.n_embd=64", "--set", "model.n_head=2"])
        .args(["--set", "model.block_size=32", "--set", "train.batch_size=4"])
        .args(extra)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn a_token_model_is_estimated_without_its_token_files_as_with_them() {
    let dir = std::env::temp_dir().join(format!("wgtrain-est-tokens-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Real files: 4,000 u16 ids below the vocabulary of 500.
    let ids: Vec<u8> = (0..4000u32).flat_map(|i| ((i * 7919 % 500) as u16).to_le_bytes()).collect();
    std::fs::write(dir.join("train.bin"), &ids).unwrap();
    std::fs::write(dir.join("val.bin"), &ids).unwrap();
    let vocab = ["--set", "model.vocab_size=500"];
    let with = token_estimate(&dir, &vocab).unwrap();
    let without = token_estimate(&dir.join("absent"), &vocab).unwrap();
    for key in ["peak_bytes", "peak_reserved_bytes", "by_category"] {
        assert_eq!(with[key], without[key], "{key}");
    }
    assert!(with["peak_bytes"].as_u64().unwrap() > 0);
    // Without a vocabulary there is nothing to estimate: said, not guessed.
    let err = token_estimate(&dir.join("absent"), &[]).unwrap_err();
    assert!(err.contains("needs model.vocab_size"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
