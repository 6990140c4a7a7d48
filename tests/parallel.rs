//! Multi-device training on lavapipe (several devices opened on one adapter): every
//! step's loss equals the single-device run's at the same global batch, for ZeRO stages
//! 0-3 and both offloads over two and three devices, fp32 and fp16-mixed, a char GPT and
//! an MLP whose parameter counts do not divide by the world size; resume on the same and
//! on another number of devices; the estimate equals each device's measured peak; a fit
//! to a budget chooses the stage and offload; out of memory on a device; bad settings
//! are refused; the logged gradient norm is the global one.

mod cli;

use std::path::{Path, PathBuf};

use cli::{char_gpt_sets, losses, run_ok, scratch, wgtrain, write_sentences};

fn corpus(dir: &Path) -> PathBuf {
    let path = dir.join("corpus.txt");
    let words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"];
    write_sentences(&path, [&words, &words, &words], 1500, 11);
    path
}

/// `wgtrain COMMAND` on a 2-layer char GPT over `devices` devices (none: one device,
/// the single-device path), with `sets` as further `--set`s.
fn gpt_args(command: &str, dir: &Path, devices: usize, sets: &[String]) -> Vec<String> {
    let mut all = char_gpt_sets(dir);
    if devices > 0 {
        all.push(format!("parallel.devices=[{}]", vec!["\"0\""; devices].join(",")));
    }
    all.extend(sets.iter().cloned());
    let mut args = vec![command.to_string()];
    if command == "train" {
        args.push("--quiet".into());
    }
    for s in all {
        args.extend(["--set".into(), s]);
    }
    args
}

/// A 4-step training run of [`gpt_args`]'s GPT (tensors not all a multiple of 2 or 3)
/// with `sets` on top; returns the log's path (checkpoints in NAME.ckpt).
fn gpt_run(dir: &Path, name: &str, devices: usize, sets: &[&str]) -> PathBuf {
    let log = dir.join(format!("{name}.jsonl"));
    let mut all = vec![
        "train.steps=4".to_string(),
        format!("checkpoint.dir=\"{}\"", dir.join(format!("{name}.ckpt")).display()),
    ];
    all.extend(sets.iter().map(|s| s.to_string()));
    let mut args = gpt_args("train", dir, devices, &all);
    args.extend(["--log".into(), log.display().to_string()]);
    run_ok(&args, &[]);
    log
}

fn assert_close(name: &str, want: &[(u64, f64)], got: &[(u64, f64)], rel: f64) {
    assert_eq!(want.len(), got.len(), "{name}: step count");
    for ((s, a), (t, b)) in want.iter().zip(got) {
        assert_eq!(s, t);
        assert!(((a - b) / a).abs() <= rel, "{name}: step {s}: single device {a}, here {b}");
    }
}

/// Each device's peak of every step line (`mem.devices`).
fn device_peaks(log: &Path) -> Vec<Vec<u64>> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            v["mem"]["devices"]
                .as_array()
                .expect("mem.devices on a multi-device line")
                .iter()
                .map(|d| d["peak"].as_u64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn every_zero_stage_matches_one_device_step_for_step() {
    let dir = scratch("parallel-gpt");
    let one = losses(&gpt_run(&dir, "one", 0, &[]));
    assert!(one.windows(2).any(|w| w[1].1 < w[0].1), "the reference run learns: {one:?}");
    for (devices, zero, offload) in [
        (1, 1, "none"),
        (2, 0, "none"),
        (2, 1, "none"),
        (2, 2, "none"),
        (3, 0, "none"),
        (3, 2, "none"),
        (2, 1, "optimizer"),
        (3, 2, "optimizer"),
        (2, 3, "none"),
        (3, 3, "optimizer"),
        (2, 3, "optimizer+parameters"),
    ] {
        let name = format!("d{devices}z{zero}{offload}");
        let sets = [format!("parallel.zero={zero}"), format!("parallel.offload=\"{offload}\"")];
        let log = gpt_run(&dir, &name, devices, &[&sets[0], &sets[1]]);
        assert_close(&name, &one, &losses(&log), 1e-4);
        if devices > 1 {
            for peaks in device_peaks(&log) {
                assert_eq!(peaks.len(), devices, "{name}: one memory record per device");
            }
        }
    }
    // Mixed precision: the loss scale, the inf/NaN check and the skip span the devices.
    let half = losses(&gpt_run(&dir, "half", 0, &["memory.precision=\"fp16-mixed\""]));
    let log = gpt_run(&dir, "half-d2z2", 2, &["memory.precision=\"fp16-mixed\"", "parallel.zero=2"]);
    assert_close("fp16-mixed zero 2", &half, &losses(&log), 1e-4);
    // Stage 3 with every-layer checkpointing: parameters gathered for each block's
    // forward and again for its recomputation.
    let ckpt = losses(&gpt_run(&dir, "ckpt", 0, &["memory.checkpoint=\"every-layer\""]));
    let log = gpt_run(&dir, "ckpt-d3z3", 3, &["memory.checkpoint=\"every-layer\"", "parallel.zero=3"]);
    assert_close("zero 3, every-layer checkpointing", &ckpt, &losses(&log), 1e-4);
    let sets = [
        "memory.checkpoint=\"every-layer\"",
        "parallel.zero=3",
        "parallel.offload=\"optimizer+parameters\"",
    ];
    let log = gpt_run(&dir, "ckpt-d2z3offp", 2, &sets);
    assert_close(
        "zero 3, parameters offloaded, every-layer checkpointing",
        &ckpt,
        &losses(&log),
        1e-4,
    );
    let sets = [
        "memory.precision=\"fp16-mixed\"",
        "parallel.zero=3",
        "parallel.offload=\"optimizer\"",
    ];
    let log = gpt_run(&dir, "half-d2z3off", 2, &sets);
    assert_close("fp16-mixed zero 3 offloaded", &half, &losses(&log), 1e-4);
    // The offloaded state is in host memory, none of it on the devices.
    let text = std::fs::read_to_string(&log).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().rfind(|l| l.contains("\"mem\"")).unwrap()).unwrap();
    assert!(last["mem"]["host"]["optimizer_state"].as_u64().unwrap() > 0, "{last}");
    for d in last["mem"]["devices"].as_array().unwrap() {
        assert_eq!(d["by_category"]["optimizer_state"].as_u64(), Some(0), "{d}");
    }
}

#[test]
fn an_mlp_matches_one_device_at_every_stage_and_offload() {
    let dir = scratch("parallel-mlp");
    let run = |name: &str, sets: &[&str]| {
        let log = dir.join(format!("{name}.jsonl"));
        let ckpt = dir.join(name);
        let mut args = cli::small_args(
            ckpt.to_str().unwrap(),
            &[
                "--set",
                "train.steps=4",
                "--set",
                "model.hidden=[33]",
                "--set",
                "train.batch_size=60",
            ],
        );
        for s in sets {
            args.extend(["--set".to_string(), s.to_string()]);
        }
        args.extend(["--log".into(), log.display().to_string()]);
        run_ok(&args, &[]);
        losses(&log)
    };
    let one = run("one", &[]);
    let three = run(
        "three",
        &[
            // Adapter indices may be written as numbers.
            "parallel.devices=[0, 0, 0]",
            "parallel.zero=2",
            "train.micro_batch_size=7",
        ],
    );
    assert_close("mlp 3 devices, zero 2, micro-batches", &one, &three, 1e-4);
    let two = run(
        "two",
        &["parallel.devices=[\"0\",\"0\"]", "parallel.zero=1", "parallel.bucket_mb=0.01"],
    );
    assert_close("mlp 2 devices, zero 1, small buckets", &one, &two, 1e-4);
    // The other stages and both offloads (33 hidden units: no tensor divides by 2 or 3).
    for (devices, zero, offload) in [
        ("[0, 0]", 0, "none"),
        ("[0, 0, 0]", 3, "none"),
        ("[0, 0]", 2, "optimizer"),
        ("[0, 0, 0]", 3, "optimizer+parameters"),
    ] {
        let sets = [
            format!("parallel.devices={devices}"),
            format!("parallel.zero={zero}"),
            format!("parallel.offload=\"{offload}\""),
        ];
        let got = run(&format!("z{zero}{offload}"), &[&sets[0], &sets[1], &sets[2]]);
        assert_close(&format!("mlp {devices}, zero {zero}, offload {offload}"), &one, &got, 1e-4);
    }
}

/// Each step's logged gradient norm (before clipping) and host memory.
fn grad_norms(log: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            let rss = v["host_rss"].as_u64().unwrap_or(0);
            assert!(rss > 10 << 20, "the process's host memory: {v}");
            (v["step"].as_u64().unwrap(), v["grad_norm"].as_f64().unwrap_or(f64::NAN))
        })
        .collect()
}

/// Each step's logged update/weight ratio of every layer, in the layers' order, with
/// the layers' names.
fn update_ratios(log: &Path) -> (Vec<(u64, f64)>, Vec<String>) {
    let mut names = Vec::new();
    let mut out = Vec::new();
    for v in std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
    {
        let by = v["update_ratio"].as_object().unwrap_or_else(|| panic!("no update_ratio: {v}"));
        let mut layers: Vec<_> = by.iter().collect();
        layers.sort_by(|a, b| a.0.cmp(b.0));
        for (name, r) in layers {
            names.push(name.clone());
            out.push((v["step"].as_u64().unwrap(), r.as_f64().unwrap()));
        }
    }
    (out, names)
}

#[test]
fn the_logged_gradient_norm_and_update_ratios_are_the_global_ones_on_any_number_of_devices() {
    let dir = scratch("par-gradnorm");
    let _ = corpus(&dir);
    // A clip that bites (the norms are well above it), so the later steps' norms also
    // depend on the clipping having used the global norm.
    let clip = ["train.grad_clip=0.5", "train.log_update_ratio=true"];
    let one_log = gpt_run(&dir, "one", 0, &clip);
    let one = grad_norms(&one_log);
    assert!(one.iter().all(|&(_, n)| n.is_finite() && n > 0.5), "{one:?}");
    let (one_ratios, layers) = update_ratios(&one_log);
    assert!(layers.iter().any(|l| l.ends_with("mlp.c_fc")), "{layers:?}");
    assert!(one_ratios.iter().all(|&(_, r)| r > 0.0 && r < 1.0), "{one_ratios:?}");
    for (name, devices, sets) in [
        ("z0", 2, vec!["parallel.zero=0"]),
        ("z2", 3, vec!["parallel.zero=2"]),
        ("z1off", 2, vec!["parallel.zero=1", "parallel.offload=\"optimizer\""]),
    ] {
        let mut all = clip.to_vec();
        all.extend(sets);
        let log = gpt_run(&dir, name, devices, &all);
        assert_close(name, &one, &grad_norms(&log), 1e-4);
        // Each device updates its shard: the ratios sum every shard's squares.
        let (ratios, names) = update_ratios(&log);
        assert_eq!(names, layers, "{name}");
        assert_close(&format!("{name} update ratios"), &one_ratios, &ratios, 1e-3);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_resumes_onto_another_number_of_devices() {
    let dir = scratch("parallel-resume");
    let full = losses(&gpt_run(&dir, "full", 2, &["parallel.zero=3", "train.steps=6"]));
    // The same run stopped after 3 steps on two devices, resumed on two as it was
    // (equal bit for bit), on three with another stage, and on one.
    let part = gpt_run(&dir, "part", 2, &["parallel.zero=3", "train.steps=3"]);
    let ckpt = dir.join("part.ckpt");
    for (name, devices, zero, offload) in [("on2", 2usize, 3, "none"), ("on3", 3, 1, "optimizer"), ("on1", 0, 0, "none")] {
        let resumed = dir.join(format!("{name}.jsonl"));
        std::fs::copy(&part, &resumed).unwrap();
        let copy = dir.join(format!("{name}.ckpt"));
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir_all(&copy).unwrap();
        for entry in walk(&ckpt) {
            let to = copy.join(entry.strip_prefix(&ckpt).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&entry, &to).unwrap();
        }
        let mut sets = vec!["train.steps=6".to_string()];
        if devices > 0 {
            sets.extend([format!("parallel.zero={zero}"), format!("parallel.offload=\"{offload}\"")]);
        }
        sets.push(format!("checkpoint.dir=\"{}\"", copy.display()));
        let mut args = gpt_args("train", &dir, devices, &sets);
        args.extend([
            "--log".into(),
            resumed.display().to_string(),
            "--resume".into(),
            copy.display().to_string(),
        ]);
        run_ok(&args, &[]);
        if name == "on2" {
            assert_eq!(full, losses(&resumed), "resumed as it ran: the same losses exactly");
        }
        assert_close(&format!("resumed {name}"), &full, &losses(&resumed), 1e-4);
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_estimate_equals_each_devices_measured_peak() {
    let dir = scratch("parallel-estimate");
    for (zero, offload) in [
        (0, "none"),
        (1, "none"),
        (2, "none"),
        (2, "optimizer"),
        (3, "none"),
        (3, "optimizer"),
        (3, "optimizer+parameters"),
    ] {
        let stage = [
            format!("parallel.zero={zero}"),
            format!("parallel.offload=\"{offload}\""),
            "train.grad_clip=0".to_string(),
        ];
        let mut args = gpt_args("estimate", &dir, 3, &stage);
        args.push("--json".into());
        let est: serde_json::Value = serde_json::from_str(&run_ok(&args, &[])).unwrap();
        let want: Vec<u64> = est["device_peaks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let log = gpt_run(&dir, &format!("z{zero}{offload}"), 3, &[&stage[0], &stage[1], &stage[2]]);
        let measured = device_peaks(&log);
        // Host memory (offloaded state) as the run's step lines say it.
        let last: serde_json::Value = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .rev()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v.get("loss").is_some())
            .unwrap();
        let host = &last["mem"]["host"];
        let host = if host.is_null() { serde_json::json!({}) } else { host.clone() };
        let want_host = est.get("host_bytes").cloned().unwrap_or(serde_json::json!({}));
        assert_eq!(host, want_host, "zero {zero} offload {offload}: host memory against the estimate");
        assert_eq!(want_host.as_object().unwrap().is_empty(), offload == "none");
        // From the second step on (the optimizer state exists), as the estimate's.
        for peaks in &measured[1..] {
            assert_eq!(peaks, &want, "zero {zero}: measured per-device peaks against the estimate");
        }
        // The formulas' model states per device: 4 bytes per weight everywhere,
        // gradients sharded from stage 2 and the two AdamW moments from stage 1.
        let m = &est["model_states"];
        let psi = m["elements"].as_u64().unwrap();
        let shard = |bytes: u64| m[if bytes == 4 { "gradients" } else { "optimizer_state" }].as_u64().unwrap();
        assert_eq!(m["parameters"].as_u64().unwrap() == 4 * psi, zero < 3, "zero {zero}: parameters");
        assert_eq!(shard(4) == 4 * psi, zero < 2, "zero {zero}: gradients {}", shard(4));
        if offload != "none" {
            assert_eq!(shard(8), 0, "offloaded optimizer state is not on the device");
            if offload == "optimizer+parameters" {
                assert_eq!(m["parameters"].as_u64(), Some(0), "offloaded weights are not on the device");
            }
            continue;
        }
        assert_eq!(shard(8) == 8 * psi, zero < 1, "zero {zero}: optimizer state {}", shard(8));
        if zero >= 1 {
            assert!(shard(8) <= 8 * psi.div_ceil(3) + 8 * 64, "{}", shard(8));
        }
    }
}

/// 8-bit AdamW sharded: its shards are cut at its blocks, so every stage (and the
/// offloaded host update) takes one device's steps; each device's peak and the host's
/// state are their estimates; a ZeRO-3 checkpoint on two devices resumes exactly on two
/// and onto one device and onto three with the state offloaded.
#[test]
fn eight_bit_adamw_shards_and_resumes_as_one_device() {
    let dir = scratch("parallel-8bit");
    let eight = "train.optimizer=\"adamw8bit\"";
    let one = losses(&gpt_run(&dir, "one", 0, &[eight, "train.steps=6"]));
    for (devices, zero, offload) in [
        (2, 1, "none"),
        (3, 2, "none"),
        (2, 3, "none"),
        (2, 1, "optimizer"),
        (3, 3, "optimizer+parameters"),
    ] {
        let name = format!("d{devices}z{zero}{offload}");
        let stage = [format!("parallel.zero={zero}"), format!("parallel.offload=\"{offload}\"")];
        let log = gpt_run(&dir, &name, devices, &[eight, "train.steps=6", &stage[0], &stage[1]]);
        assert_close(&name, &one, &losses(&log), 1e-4);
        let mut args = gpt_args("estimate", &dir, devices, &[eight.to_string(), stage[0].clone(), stage[1].clone()]);
        args.push("--json".into());
        let est: serde_json::Value = serde_json::from_str(&run_ok(&args, &[])).unwrap();
        let want: Vec<u64> = est["device_peaks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        for peaks in &device_peaks(&log)[1..] {
            assert_eq!(peaks, &want, "{name}: measured per-device peaks against the estimate");
        }
        // Offloaded, the 8-bit moments live on the host, as many bytes as estimated.
        if offload != "none" {
            let text = std::fs::read_to_string(&log).unwrap();
            let last: serde_json::Value = serde_json::from_str(text.lines().rfind(|l| l.contains("\"mem\"")).unwrap()).unwrap();
            assert_eq!(
                last["mem"]["host"]["optimizer_state"], est["host_bytes"]["optimizer_state"],
                "{name}"
            );
        }
    }
    // Three steps on two devices at stage 3, then resumed.
    let part = gpt_run(&dir, "part", 2, &[eight, "train.steps=3", "parallel.zero=3"]);
    let full = losses(&gpt_run(&dir, "full", 2, &[eight, "train.steps=6", "parallel.zero=3"]));
    for (name, devices, zero) in [("on2", 2usize, 3), ("on3", 3, 1), ("on1", 0, 0)] {
        let offload = if name == "on3" { "optimizer" } else { "none" };
        let resumed = dir.join(format!("{name}.jsonl"));
        std::fs::copy(&part, &resumed).unwrap();
        let copy = dir.join(format!("{name}.ckpt"));
        let _ = std::fs::remove_dir_all(&copy);
        for entry in walk(&dir.join("part.ckpt")) {
            let to = copy.join(entry.strip_prefix(dir.join("part.ckpt")).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&entry, &to).unwrap();
        }
        let mut sets = vec![
            eight.to_string(),
            "train.steps=6".to_string(),
            format!("checkpoint.dir=\"{}\"", copy.display()),
        ];
        if devices > 0 {
            sets.extend([format!("parallel.zero={zero}"), format!("parallel.offload=\"{offload}\"")]);
        }
        let mut args = gpt_args("train", &dir, devices, &sets);
        args.extend([
            "--log".into(),
            resumed.display().to_string(),
            "--resume".into(),
            copy.display().to_string(),
        ]);
        run_ok(&args, &[]);
        if name == "on2" {
            assert_eq!(full, losses(&resumed), "resumed as it ran: the same losses exactly");
        }
        assert_close(&format!("8-bit resumed {name}"), &full, &losses(&resumed), 1e-4);
    }
}

#[test]
fn bad_parallel_settings_are_refused_with_the_reason() {
    let dir = scratch("parallel-bad");
    let text = corpus(&dir);
    for (set, says) in [
        ("parallel.devices=[\"0\",\"0\",\"0\"]", "does not split evenly over the 3 devices"),
        ("parallel.zero=5", "parallel.zero must be 0, 1, 2 or 3"),
        ("parallel.offload=\"disk\"", "parallel.offload must be"),
        ("parallel.bucket_mb=0", "parallel.bucket_mb must be in"),
        ("parallel.offload=\"optimizer\"", "need parallel.devices"),
        ("parallel.offload=\"optimizer+parameters\"", "need parallel.devices"),
        ("parallel.devices=[\"0\",\"no-such-adapter\"]", "no-such-adapter"),
    ] {
        let args = [
            "train",
            "--set",
            "model.kind=\"gpt\"",
            "--set",
            "data.kind=\"chars\"",
            "--set",
            &format!("data.path=\"{}\"", text.display()),
            "--set",
            "train.batch_size=32",
            "--set",
            "train.steps=1",
            "--set",
            set,
        ];
        let out = wgtrain(&args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(err.contains(says), "{set}: {err}");
        assert!(!err.contains("panicked"), "{set}: {err}");
    }
}

#[test]
fn a_fit_chooses_the_zero_stage_and_offload_that_fit_the_budget() {
    let dir = scratch("parallel-fit");
    // A wider GPT than the others, so stages differ by whole pages: on two devices its
    // estimated reserved peaks are 28 MiB (zero 0), 22 (zero 1), 22 (zero 2), 24 (zero
    // 3) and 16 (zero 2 with the optimizer offloaded).
    let wide = ["model.n_embd=256", "train.steps=2", "memory.fit=true"];
    for (budget, want) in [("25MiB", "zero 1, offload none"), ("20MiB", "offload optimizer")] {
        let mut sets: Vec<&str> = wide.to_vec();
        let b = format!("memory.budget=\"{budget}\"");
        sets.push(&b);
        let log = dir.join(format!("fit{budget}.jsonl"));
        let mut args = gpt_args("train", &dir, 2, &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        args.extend(["--log".into(), log.display().to_string()]);
        let out = wgtrain(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "budget {budget}: {err}");
        let note = err
            .lines()
            .find(|l| l.starts_with("fit to memory.budget"))
            .unwrap_or_else(|| panic!("no fit note: {err}"));
        assert!(note.contains(want), "budget {budget}: {note}");
        assert!(note.contains("on each device"), "{note}");
        // What it chose holds: no device reserved more than the budget.
        let limit = budget.trim_end_matches("MiB").parse::<u64>().unwrap() << 20;
        for line in std::fs::read_to_string(&log).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            for d in v["mem"]["devices"].as_array().into_iter().flatten() {
                assert!(d["peak_reserved"].as_u64().unwrap() <= limit, "budget {budget}: {d}");
            }
        }
    }
}

#[test]
fn a_device_out_of_memory_halves_the_micro_batch_on_every_device() {
    let dir = scratch("parallel-oom");
    let one = losses(&gpt_run(&dir, "one", 0, &[]));
    // A cap under what a whole share needs: the step fails, is retried with the cache
    // emptied, then with half the micro-batch on every device, and goes on.
    let log = gpt_run(&dir, "capped", 2, &["parallel.zero=2", "memory.cap=\"1MiB\""]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("micro-batch halved"), "the log records the halving");
    assert_close("out of memory, micro-batch halved", &one, &losses(&log), 1e-4);
}

/// The Llama's keys on top of [`gpt_args`]' sizes: grouped-query heads (2 query heads
/// on 1 key/value head), SwiGLU.
const LLAMA: [&str; 3] = ["model.kind=\"llama\"", "model.n_kv_head=1", "model.intermediate_size=48"];
/// BERT's, trained as a masked language model, with dropout.
const BERT: [&str; 3] = ["model.kind=\"bert\"", "model.intermediate_size=48", "model.dropout=0.1"];

#[test]
fn a_llama_matches_one_device_at_every_stage_and_its_estimate_is_each_devices_peak() {
    the_model_matches_its_reference_at_every_stage("parallel-llama", &LLAMA, 0);
}

/// With dropout and masking drawn per device and micro-batch (as DDP's ranks draw
/// theirs), the reference is plain data parallelism over the same two devices.
#[test]
fn a_bert_matches_data_parallel_at_every_stage_and_its_estimate_is_each_devices_peak() {
    the_model_matches_its_reference_at_every_stage("parallel-bert", &BERT, 2);
}

/// ZeRO 1-3, offload and checkpointing against a reference run on `reference` devices
/// (0: the single-device path), and the estimate against each device's measured peak,
/// for the model `keys` set on top of [`gpt_args`].
fn the_model_matches_its_reference_at_every_stage(name: &str, keys: &[&str], reference: usize) {
    let dir = scratch(name);
    let with = |extra: &[&str]| -> Vec<String> { keys.iter().chain(extra).map(|s| s.to_string()).collect() };
    let run = |name: &str, devices: usize, extra: &[&str]| {
        let sets = with(extra);
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        losses(&gpt_run(&dir, name, devices, &refs))
    };
    let one = run("one", reference, &[]);
    assert!(one.windows(2).any(|w| w[1].1 < w[0].1), "the reference run learns: {one:?}");
    let ckpt = run("ckpt", reference, &["memory.checkpoint=\"every-layer\""]);
    assert_eq!(one, ckpt, "recomputing every layer changes nothing");
    let stages = [
        (2, vec!["parallel.zero=1"]),
        (3, vec!["parallel.zero=2", "parallel.offload=\"optimizer\""]),
        (2, vec!["parallel.zero=3", "memory.checkpoint=\"every-layer\""]),
        (
            2,
            vec![
                "parallel.zero=3",
                "parallel.offload=\"optimizer+parameters\"",
                "memory.checkpoint=\"every-layer\"",
            ],
        ),
    ];
    for (devices, extra) in stages.into_iter().filter(|(d, _)| reference == 0 || *d == reference) {
        let name = format!("d{devices}{}", extra.join("").replace(['"', '=', '.', '+'], ""));
        assert_close(&name, &one, &run(&name, devices, &extra), 1e-4);
    }
    for extra in [
        vec!["parallel.zero=0"],
        vec![
            "parallel.zero=3",
            "parallel.offload=\"optimizer\"",
            "memory.checkpoint=\"every-layer\"",
        ],
    ] {
        let mut sets = with(&extra);
        sets.push("train.grad_clip=0".into());
        let mut args = gpt_args("estimate", &dir, 2, &sets);
        args.push("--json".into());
        let est: serde_json::Value = serde_json::from_str(&run_ok(&args, &[])).unwrap();
        let want: Vec<u64> = est["device_peaks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        let log = gpt_run(&dir, &format!("est{}", extra.len()), 2, &refs);
        for peaks in &device_peaks(&log)[1..] {
            assert_eq!(peaks, &want, "{extra:?}: measured per-device peaks against the estimate");
        }
    }
}
