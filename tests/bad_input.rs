//! Bad values are refused before training with a message that names them, by real
//! processes: numeric settings out of their ranges, sizes no adapter could hold (never
//! a host allocation of hundreds of GB), sizes as TOML numbers, data too small for one
//! window, a resume onto another model shape or optimizer, a token file truncated
//! while training (an error, not SIGBUS), `wgtrain step` with every label ignored (NaN
//! as PyTorch), paths named in I/O errors, special files (FIFOs, devices) refused
//! instead of read forever, a gzip bomb refused at its header's size, bench shapes
//! checked before allocating, and a closed stdout ending quietly.

mod cli;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli::{gpt_args, run_ok, scratch, small_args, wgtrain};

fn refused(args: &[String]) -> String {
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let start = Instant::now();
    let out = wgtrain(&refs, &[]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail with a message: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(60), "{args:?} took {:?}", start.elapsed());
    err
}

fn train_with(dir: &Path, sets: &[&str]) -> Vec<String> {
    let mut extra: Vec<&str> = vec!["--set", "train.steps=2"];
    for s in sets {
        extra.extend(["--set", s]);
    }
    small_args(dir.join("ckpt").to_str().unwrap(), &extra)
}

#[test]
fn numeric_settings_out_of_range_are_named() {
    let dir = scratch("ranges");
    for (set, says) in [
        ("train.min_lr=-5", "train.min_lr must be a number >= 0, got -5"),
        ("train.min_lr=nan", "train.min_lr must be a number >= 0, got NaN"),
        ("train.weight_decay=nan", "train.weight_decay must be a number >= 0"),
        ("train.betas=[1.0, 1.0]", "train.betas[0] must be in [0, 1)"),
        ("train.betas=[0.9, nan]", "train.betas[1] must be in [0, 1)"),
        ("train.grad_clip=nan", "train.grad_clip must be a number >= 0"),
        ("train.grad_clip=-1", "train.grad_clip must be a number >= 0"),
        ("train.momentum=1.5", "train.momentum must be in [0, 1)"),
        ("train.batch_size=0", "train.batch_size must be in 1..="),
    ] {
        let err = refused(&train_with(&dir, &[set]));
        assert!(err.contains(says), "{set}: {err}");
    }
    // Values of the wrong type name the key and what it takes, in the config's words.
    for (set, says) in [
        (
            "train.batch_size=\"abc\"",
            "train.batch_size takes a whole number (0 or more), not the string \"abc\"",
        ),
        ("train.batch_size=-3", "train.batch_size takes a whole number (0 or more), not -3"),
        ("train.lr=[1]", "train.lr takes a number, not a list"),
        ("parallel.devices=3", "parallel.devices takes a list (like [1, 2]), not 3"),
        (
            "memory.optimizer_in_backward=3",
            "memory.optimizer_in_backward takes true or false, not 3",
        ),
    ] {
        let err = refused(&train_with(&dir, &[set]));
        assert!(err.contains(says), "{set}: {err}");
        assert!(!err.contains("usize") && !err.contains("sequence"), "serde's words: {err}");
    }
    // A huge epoch count is refused, not wrapped into zero steps.
    let mut args = small_args(dir.join("ckpt").to_str().unwrap(), &["--set", "train.epochs=100000000000"]);
    args.retain(|a| a != "train.steps=2");
    let err = refused(&args);
    assert!(err.contains("train.epochs must be in 1..=1000000"), "{err}");
}

#[test]
fn sizes_no_adapter_holds_are_refused_before_allocating() {
    let dir = scratch("sizes");
    // In range, but one weight is larger than a binding: refused, not a 313 GB host
    // allocation.
    let err = refused(&train_with(&dir, &["model.hidden=[100000000]"]));
    assert!(err.contains("model.hidden[i] must be in 1..="), "{err}");
    let err = refused(&train_with(&dir, &["model.hidden=[1000000]"]));
    assert!(err.contains("larger than one buffer binding"), "{err}");
    // A GPT of 10^11 layers: train, estimate and `wgtrain step`'s config.json.
    let corpus = dir.join("text.txt");
    std::fs::write(&corpus, "the quick brown fox jumps over the lazy dog\n".repeat(200)).unwrap();
    for command in ["train", "estimate"] {
        let err = refused(&gpt_args(command, "chars", &corpus, &["model.n_layer=100000000000"]));
        assert!(err.contains("model.n_layer must be in 1..=1024"), "{command}: {err}");
    }
    let step = step_with_config(&dir, "n_layer", 100_000_000_000u64.into());
    let err = refused(&step);
    assert!(err.contains("n_layer 100000000000 is above the largest the engine builds"), "{err}");
}

/// `wgtrain step` on the smallest GPT-2 fixture copied into `dir` with its config.json's
/// `key` set to `value`.
fn step_with_config(dir: &Path, key: &str, value: serde_json::Value) -> Vec<String> {
    let hf = dir.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2/l1_h1_c16");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(fixture.join("model.safetensors"), hf.join("model.safetensors")).unwrap();
    [
        "step",
        "--hf-dir",
        hf.to_str().unwrap(),
        "--batch",
        fixture.join("batch.safetensors").to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn memory_sizes_may_be_toml_numbers() {
    let dir = scratch("capnum");
    for set in ["memory.cap=1000000000", "memory.cap=0.5"] {
        let mut args = train_with(&dir, &[set]);
        args.push("--overwrite".into());
        run_ok(&args, &[]);
    }
}

#[test]
fn data_too_small_for_one_window_is_an_error() {
    let dir = scratch("small-data");
    let corpus = dir.join("tiny.txt");
    std::fs::write(&corpus, "abc\n").unwrap();
    let err = refused(&gpt_args("train", "chars", &corpus, &["model.block_size=64"]));
    assert!(err.contains("no example") || err.contains("shorter than"), "{err}");
}

#[test]
fn resuming_onto_another_shape_or_optimizer_is_refused() {
    let dir = scratch("resume-shape");
    let corpus = dir.join("text.txt");
    std::fs::write(&corpus, "the quick brown fox jumps over the lazy dog\n".repeat(300)).unwrap();
    let ckpt = dir.join("ckpt");
    let dir_set = format!("checkpoint.dir=\"{}\"", ckpt.display());
    let args = |sets: &[&str]| -> Vec<String> {
        let mut all = vec![
            "model.block_size=16",
            "model.n_embd=16",
            "model.n_layer=1",
            "train.batch_size=4",
            "data.eval_limit=8",
            &dir_set,
        ];
        all.extend(sets);
        gpt_args("train", "chars", &corpus, &all)
    };
    run_ok(&args(&["model.n_head=2", "train.steps=1"]), &[]);
    let mut other_heads = args(&["model.n_head=4", "train.steps=2"]);
    other_heads.extend(["--resume".into(), ckpt.display().to_string()]);
    let err = refused(&other_heads);
    assert!(err.contains("model.n_head was 2, is 4"), "{err}");
    let mut other_optimizer = args(&["model.n_head=2", "train.steps=2", "train.optimizer=\"sgd\""]);
    other_optimizer.extend(["--resume".into(), ckpt.display().to_string()]);
    let err = refused(&other_optimizer);
    assert!(err.contains("train.optimizer was adamw, is sgd"), "{err}");
}

#[test]
fn a_token_file_truncated_while_training_is_an_error_not_a_crash() {
    let dir = scratch("truncated");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let tokens: Vec<u8> = (0..400_000u32).flat_map(|i| ((i * 7919 % 97) as u16).to_le_bytes()).collect();
    std::fs::write(data.join("train.bin"), &tokens).unwrap();
    std::fs::write(data.join("val.bin"), &tokens[..20_000]).unwrap();
    let log = dir.join("run.jsonl");
    let mut args = gpt_args(
        "train",
        "tokens",
        &data,
        &[
            "model.vocab_size=97",
            "model.block_size=16",
            "model.n_embd=16",
            "model.n_head=2",
            "model.n_layer=1",
            "train.batch_size=4",
            "train.steps=100000",
            "train.eval_every=1000000",
            "checkpoint.every=0",
        ],
    );
    let ckpt = dir.join("ckpt");
    args.extend(["--set".into(), format!("checkpoint.dir=\"{}\"", ckpt.display())]);
    args.extend(["--log".into(), log.display().to_string()]);
    let child = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(&log).map(|t| t.lines().count()).unwrap_or(0) < 2 {
        assert!(start.elapsed() < Duration::from_secs(120), "no steps logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(data.join("train.bin"))
        .unwrap()
        .set_len(64)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a clear error, not a signal: {err}");
    assert!(err.contains("train.bin") && err.contains("truncated"), "{err}");
    // With checkpoint.every = 0 the steps done before the error are saved once, at it.
    let steps = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"loss\""))
        .count();
    let latest = std::fs::read_to_string(ckpt.join("latest")).expect("a checkpoint saved at the error");
    assert_eq!(latest.trim(), format!("step-{steps:09}"), "{err}");
}

#[test]
fn step_with_every_label_ignored_is_nan_and_errors_name_files() {
    let dir = scratch("step");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2/l1_h1_c16");
    let batch = dir.join("ignored.safetensors");
    let (b, t) = (2usize, 8usize);
    let ids: Vec<i64> = (0..(b * t) as i64).map(|i| i % 50).collect();
    let labels = vec![-100i64; b * t];
    let views = vec![
        (
            "input_ids",
            safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![b, t], bytemuck::cast_slice(&ids)).unwrap(),
        ),
        (
            "labels",
            safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![b, t], bytemuck::cast_slice(&labels)).unwrap(),
        ),
    ];
    std::fs::write(&batch, safetensors::serialize(views, None).unwrap()).unwrap();
    let out = run_ok(
        &[
            "step",
            "--hf-dir",
            fixture.to_str().unwrap(),
            "--batch",
            batch.to_str().unwrap(),
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>(),
        &[],
    );
    assert!(out.contains("NaN") || out.contains("null"), "PyTorch gives NaN: {out}");
    // A missing file is an I/O error naming it, not a "shape error".
    let missing = dir.join("missing.safetensors");
    let err = refused(
        &["step", "--hf-dir", fixture.to_str().unwrap(), "--batch", missing.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    );
    assert!(err.contains(missing.to_str().unwrap()) && !err.contains("shape error"), "{err}");
    // `bench --json` into a missing folder names the path.
    let target = dir.join("no/such/dir/bench.json");
    let err = refused(
        &[
            "bench",
            "--quick",
            "--filter",
            "launch_overhead",
            "--json",
            target.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>(),
    );
    assert!(err.contains(target.to_str().unwrap()), "{err}");
}

/// Runs `wgtrain ARGS` with stdout a pipe closed before anything is written.
fn with_closed_stdout(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let dir = scratch("stdout");
    let ckpt = dir.join("ckpt");
    let train = small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=2"]);
    let train: Vec<&str> = train.iter().map(String::as_str).collect();
    for args in [&["devices"][..], &["devices", "--json"], &train] {
        let out = with_closed_stdout(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(ckpt.join("step-000000002/manifest.json").is_file(), "the run saved before printing");
}

#[test]
fn matmul_sizes_are_checked_before_anything_is_allocated() {
    for shape in ["100000x100000x100000", "18446744073709551615x2x2", "4000000000x1x1"] {
        let err = refused(&["bench".into(), "--quick".into(), "--matmul".into(), shape.into()]);
        assert!(err.contains("more than one buffer binding"), "{shape}: {err}");
    }
}

#[test]
fn special_files_are_refused_not_read_forever() {
    let dir = scratch("special");
    // A FIFO as a token file would block its open; /dev/zero as a text corpus would
    // be read forever; a device as the log would never hold the lines.
    let tokens = dir.join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    let fifo = tokens.join("train.bin");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::fs::write(tokens.join("val.bin"), vec![0u8; 4096]).unwrap();
    let err = refused(&gpt_args(
        "train",
        "tokens",
        &tokens,
        &["model.vocab_size=97", "model.block_size=16", "train.steps=1"],
    ));
    assert!(
        err.contains("train.bin") && err.contains("not a regular file") && err.contains("FIFO"),
        "{err}"
    );
    let err = refused(&gpt_args("train", "chars", Path::new("/dev/zero"), &["train.steps=1"]));
    assert!(err.contains("/dev/zero") && err.contains("not a regular file"), "{err}");
    let mut args = small_args(dir.join("ckpt").to_str().unwrap(), &["--set", "train.steps=1"]);
    args.extend(["--log".into(), "/dev/full".into()]);
    let err = refused(&args);
    assert!(err.contains("/dev/full is a device"), "{err}");
    let mut args = small_args(dir.join("ckpt").to_str().unwrap(), &["--set", "train.steps=1"]);
    args.extend(["--log".into(), dir.display().to_string()]);
    let err = refused(&args);
    assert!(err.contains("is a folder, not a file"), "{err}");
}

#[test]
fn a_compression_bomb_is_refused_at_its_headers_size() {
    let dir = scratch("bomb");
    let fashion = dir.join("fashion");
    std::fs::create_dir_all(&fashion).unwrap();
    // A valid header for 10 images of 28 x 28, then 200 MB of zeros (200 KB gzipped).
    let script = format!(
        "(printf '\\000\\000\\010\\003\\000\\000\\000\\012\\000\\000\\000\\034\\000\\000\\000\\034'; head -c 200000000 /dev/zero) | gzip -1 > {0}/train-images-idx3-ubyte.gz; \
         (printf '\\000\\000\\010\\001\\000\\000\\000\\012'; head -c 10 /dev/zero) | gzip > {0}/train-labels-idx1-ubyte.gz",
        fashion.display()
    );
    assert!(Command::new("sh").args(["-c", &script]).status().unwrap().success());
    let mut args = small_args(dir.join("ckpt").to_str().unwrap(), &["--set", "train.steps=1"]);
    args.extend(["--set".into(), format!("data.path=\"{}\"", fashion.display())]);
    let err = refused(&args);
    assert!(err.contains("train-images-idx3-ubyte.gz") && err.contains("holds more"), "{err}");
}

#[test]
fn settings_are_checked_against_each_other_and_named() {
    let dir = scratch("cross");
    for (set, says) in [
        ("train.micro_batch_size=128", "train.micro_batch_size must be in 1..=64"),
        // A key of another model kind is named with the kind that has it.
        (
            "model.n_layer=2",
            "model.n_layer is not a key of model.kind \"mlp\" (its keys: hidden); model.kind \"gpt\" or \"llama\" or \"bert\" have it",
        ),
        ("model.rope_theta=1", "model.kind \"llama\" has it"),
        ("memory.cap=\"1e30GiB\"", "of at most 1 PiB"),
        ("memory.cap=1e20", "of at most 1 PiB"),
        ("memory.cap=true", "memory.cap and memory.budget take a size"),
        ("parallel.devices=[-1]", "parallel.devices takes adapter selectors"),
        ("checkpoint.dir=\"\"", "checkpoint.dir is empty"),
    ] {
        let mut args = small_args(dir.join("ckpt").to_str().unwrap(), &["--set", "train.steps=1"]);
        match args
            .iter_mut()
            .find(|a| a.starts_with("checkpoint.dir=") && set.starts_with("checkpoint.dir="))
        {
            Some(a) => *a = set.into(),
            None => args.extend(["--set".into(), set.into()]),
        }
        let err = refused(&args);
        assert!(err.contains(says), "{set}: {err}");
    }
    // Decimal units as well as binary ones.
    let mut args = small_args(
        dir.join("ok").to_str().unwrap(),
        &["--set", "train.steps=1", "--set", "memory.cap=\"1TB\""],
    );
    args[0] = "estimate".into();
    args.retain(|a| a != "--quiet");
    run_ok(&args, &[]);
    // profile's peak must be a positive number (clap's usage error, exit 2).
    for peak in ["0", "-3", "nan", "inf"] {
        let out = wgtrain(&["profile", &format!("--peak-tflops={peak}")], &[]);
        assert_eq!(out.status.code(), Some(2), "{peak}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a positive number"), "{peak}");
    }
    // An empty split of an MLP's data names the limits, not a GPT's block_size.
    let empty = dir.join("empty-fashion");
    std::fs::create_dir_all(&empty).unwrap();
    let script = format!(
        "printf '\\000\\000\\010\\003\\000\\000\\000\\000\\000\\000\\000\\034\\000\\000\\000\\034' | gzip > {0}/train-images-idx3-ubyte.gz; \
         printf '\\000\\000\\010\\001\\000\\000\\000\\000' | gzip > {0}/train-labels-idx1-ubyte.gz; \
         cp /usr/share/datasets/fashion-mnist/t10k-* {0}/",
        empty.display()
    );
    assert!(Command::new("sh").args(["-c", &script]).status().unwrap().success());
    let mut args = small_args(dir.join("e").to_str().unwrap(), &["--set", "train.steps=1"]);
    let limit = args.iter().position(|a| a == "data.train_limit=384").unwrap();
    args.drain(limit - 1..=limit);
    args.extend(["--set".into(), format!("data.path=\"{}\"", empty.display())]);
    let err = refused(&args);
    assert!(err.contains("has no example") && !err.contains("block_size"), "{err}");
}

#[test]
fn a_resume_with_other_batches_is_refused() {
    let dir = scratch("other-batches");
    let ckpt = dir.join("ckpt");
    let c = ckpt.to_str().unwrap();
    run_ok(&small_args(c, &["--set", "train.steps=2"]), &[]);
    for (set, says) in [
        ("train.batch_size=32", "train.batch_size was 64, is 32"),
        ("train.seed=7", "train.seed was 0, is 7"),
        ("data.train_limit=256", "data.train_limit was 384, is 256"),
    ] {
        let mut args = small_args(c, &["--set", "train.steps=3", "--set", set]);
        args.extend(["--resume".into(), c.into()]);
        let err = refused(&args);
        assert!(err.contains(says), "{set}: {err}");
    }
}

#[test]
fn a_negative_layer_norm_epsilon_is_refused_by_step() {
    let args = step_with_config(&scratch("eps"), "layer_norm_epsilon", (-1.0).into());
    let err = refused(&args);
    assert!(err.contains("layer_norm_epsilon -1 must be a positive number"), "{err}");
}

#[test]
fn step_refuses_an_empty_batch_and_big_sequences_name_the_activation() {
    let dir = scratch("empty-batch");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2/l1_h1_c16");
    // A [1, 0] batch: no token to compute a loss over.
    let batch = dir.join("empty.safetensors");
    let mut header = serde_json::json!({
        "input_ids": {"dtype": "I64", "shape": [1, 0], "data_offsets": [0, 0]},
        "labels": {"dtype": "I64", "shape": [1, 0], "data_offsets": [0, 0]},
    })
    .to_string()
    .into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    std::fs::write(&batch, &bytes).unwrap();
    let args: Vec<String> = ["step", "--hf-dir", fixture.to_str().unwrap(), "--batch", batch.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let err = refused(&args);
    assert!(err.contains("at least one token"), "{err}");
    // A sequence whose activations no binding holds names the activation, not the
    // parameter its op is named after.
    let corpus = dir.join("text.txt");
    std::fs::write(&corpus, "the quick brown fox jumps over the lazy dog\n".repeat(20_000)).unwrap();
    let err = refused(&gpt_args(
        "estimate",
        "chars",
        &corpus,
        &[
            "model.block_size=500000",
            "model.n_embd=32",
            "model.n_head=2",
            "train.batch_size=32",
        ],
    ));
    assert!(err.contains("for the activation"), "{err}");
}

#[test]
fn token_files_of_u32_ids_hold_large_vocabularies() {
    let dir = scratch("u32");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    // Ids up to 99,999: past what u16 holds.
    let ids: Vec<u8> = (0..20_000u32).flat_map(|i| (i * 7919 % 100_000).to_le_bytes()).collect();
    std::fs::write(data.join("train.bin"), &ids).unwrap();
    std::fs::write(data.join("val.bin"), &ids[..8_000]).unwrap();
    let sets = [
        "model.vocab_size=100000",
        "model.block_size=16",
        "model.n_embd=16",
        "model.n_head=2",
        "model.n_layer=1",
        "train.batch_size=2",
        "train.steps=2",
    ];
    // A vocabulary that u16 ids cannot hold is refused, saying what to set.
    let err = refused(&gpt_args("train", "tokens", &data, &sets));
    assert!(
        err.contains("does not fit u16 token ids") && err.contains("data.token_dtype"),
        "{err}"
    );
    let mut u32_sets = sets.to_vec();
    u32_sets.push("data.token_dtype=\"u32\"");
    let out = run_ok(&gpt_args("train", "tokens", &data, &u32_sets), &[]);
    assert!(out.contains("2 steps"), "{out}");
    // A file that is not whole u32 ids, and an id past the vocabulary, are named.
    std::fs::write(data.join("val.bin"), &ids[..8_002]).unwrap();
    let err = refused(&gpt_args("train", "tokens", &data, &u32_sets));
    assert!(err.contains("val.bin") && err.contains("whole number of u32 tokens"), "{err}");
    std::fs::write(data.join("val.bin"), &ids[..8_000]).unwrap();
    let mut small = u32_sets.clone();
    small[0] = "model.vocab_size=50000";
    let err = refused(&gpt_args("train", "tokens", &data, &small));
    assert!(
        err.contains("train.bin") && err.contains("not below model.vocab_size 50000"),
        "{err}"
    );
}

#[test]
fn warmup_longer_than_the_run_is_said_and_one_width_needs_no_brackets() {
    let dir = scratch("warmup");
    // A short trial of a long run's config is allowed, and the terminal says so.
    let args = train_with(&dir, &["train.warmup_steps=10", "model.hidden=24"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = wgtrain(&refs, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("train.warmup_steps 10 is more than the run's 2 steps"), "{err}");
    // Not a terminal: a plain line, no color codes, no timestamps or module paths.
    let warning = err.lines().find(|l| l.contains("warmup_steps")).unwrap();
    assert_eq!(
        warning.trim_start(),
        "WARN train.warmup_steps 10 is more than the run's 2 steps: the learning rate never reaches train.lr"
    );
    let err = refused(&train_with(&dir.join("b"), &["model.hidden=\"wide\""]));
    assert!(err.contains("model.hidden takes widths"), "{err}");
}
