//! Running the `wgtrain` binary in tests: a scratch folder, the small Fashion-MNIST run
//! (384 examples in batches of 64, 6 steps per epoch, a 32-wide MLP), the losses of
//! a JSONL log, and small texts with structure for character GPTs.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `wgtrain ARGS` with extra environment, waiting for it.
pub fn wgtrain(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgtrain"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run wgtrain")
}

/// A fresh folder for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgtrain-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small run: 384 training examples in batches of 64 (6 steps per epoch).
pub fn small_args<'a>(dir: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "train".into(),
        "--quiet".into(),
        "--set".into(),
        "data.train_limit=384".into(),
        "--set".into(),
        "data.eval_limit=200".into(),
        "--set".into(),
        "train.batch_size=64".into(),
        "--set".into(),
        "model.hidden=[32]".into(),
        "--set".into(),
        format!("checkpoint.dir=\"{dir}\""),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Every step line of a log (the lines with a loss), as JSON.
pub fn step_lines(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("loss").is_some())
        .collect()
}

/// (step, loss) of every step line of a log.
pub fn losses(log: &Path) -> Vec<(u64, f64)> {
    step_lines(log)
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// Runs `wgtrain ARGS` and insists on success; returns its standard output.
pub fn run_ok(args: &[String], env: &[(&str, &str)]) -> String {
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = wgtrain(&refs, env);
    assert!(
        out.status.success(),
        "wgtrain {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `wgtrain COMMAND` on a GPT over `data_kind` data at `path`, with `sets` as
/// `--set` overrides (`train` runs quietly).
pub fn gpt_args(command: &str, data_kind: &str, path: &Path, sets: &[&str]) -> Vec<String> {
    let mut args = vec![command.to_string()];
    if command == "train" {
        args.push("--quiet".into());
    }
    let base = [
        "model.kind=\"gpt\"".to_string(),
        format!("data.kind=\"{data_kind}\""),
        format!("data.path=\"{}\"", path.display()),
    ];
    for s in base.iter().map(String::as_str).chain(sets.iter().copied()) {
        args.extend(["--set".to_string(), s.to_string()]);
    }
    args
}

/// Writes `lines` three-word sentences to `path`, the words drawn from `words` by a
/// seeded linear congruential generator: a text with structure for a character GPT.
pub fn write_sentences(path: &Path, words: [&[&str]; 3], lines: usize, seed: u64) {
    let (a, b, c) = (words[0].len(), words[1].len(), words[2].len());
    let mut state = seed;
    let mut text = String::new();
    for _ in 0..lines {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let r = (state >> 33) as usize;
        text += &format!("{} {} {}.\n", words[0][r % a], words[1][(r / a) % b], words[2][(r / (a * b)) % c]);
    }
    std::fs::write(path, text).unwrap();
}

/// The `--set` values of the small character GPT the multi-device tests train (2
/// layers, 40 wide, batch 12) on a text of sentences it writes into `dir` once.
pub fn char_gpt_sets(dir: &Path) -> Vec<String> {
    let text = dir.join("corpus.txt");
    if !text.exists() {
        let words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"];
        write_sentences(&text, [&words, &words, &words], 1500, 11);
    }
    vec![
        "model.kind=\"gpt\"".to_string(),
        "data.kind=\"chars\"".into(),
        format!("data.path=\"{}\"", text.display()),
        "model.n_layer=2".into(),
        "model.n_head=2".into(),
        "model.n_embd=40".into(),
        "model.block_size=24".into(),
        "train.batch_size=12".into(),
        "train.eval_every=0".into(),
        // The evaluation that ends each run: two batches, not the whole held-out text
        // (a third of a 4-step run's time on lavapipe).
        "data.eval_limit=24".into(),
        "train.lr=3e-3".into(),
        "train.schedule=\"constant\"".into(),
        "train.grad_clip=1.0".into(),
    ]
}
