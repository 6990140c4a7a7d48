//! `wgtrain train` end to end on Fashion-MNIST subsets: the JSONL log, resume equal to
//! an uninterrupted run step for step, a corrupted checkpoint refused, a save killed
//! mid-way leaving the previous checkpoint loadable, config errors that say what is
//! wrong, a fresh run refusing another run's log, and `--tensorboard` event files read
//! back by TensorBoard's own reader equal to the log.

mod cli;

use std::process::Command;

use cli::{losses, run_ok, scratch, small_args, step_lines, wgtrain, write_sentences};

#[test]
fn log_lines_carry_loss_time_and_memory_by_category() {
    let dir = scratch("log");
    // In folders that do not exist yet: the run makes them.
    let log = dir.join("new/folders/run.jsonl");
    let ckpt = dir.join("ckpt");
    let mut args = small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=6"]);
    args.extend(["--log".into(), log.display().to_string()]);
    run_ok(&args, &[]);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<&serde_json::Value> = lines.iter().filter(|v| v.get("loss").is_some()).collect();
    assert_eq!(steps.len(), 6);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut last_time = 0.0;
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"].as_u64(), Some(i as u64 + 1));
        for key in ["lr", "step_ms", "samples_per_s"] {
            assert!(s[key].as_f64().unwrap() > 0.0, "{key}: {s}");
        }
        // Wall time: seconds since the epoch, in order, within this test's run.
        let time = s["time"].as_f64().unwrap();
        assert!(time >= last_time && time <= now && time > now - 600.0, "time {time} now {now}");
        last_time = time;
        let mem = &s["mem"];
        for key in ["allocated", "reserved", "peak", "num_ooms", "num_alloc_retries"] {
            assert!(mem[key].is_u64(), "mem.{key}: {mem}");
        }
        assert!(mem["fragmentation"].is_f64());
        let cats = mem["by_category"].as_object().unwrap();
        for c in [
            "parameter",
            "gradient",
            "optimizer_state",
            "activation",
            "kv_cache",
            "temporary",
            "input",
            "other",
        ] {
            assert!(cats.contains_key(c), "by_category.{c}");
        }
        // 784*32+32 + 32*10+10 parameters in f32, each tensor in its own block.
        assert!(cats["parameter"].as_u64().unwrap() >= 4 * (784 * 32 + 32 + 32 * 10 + 10));
        assert!(mem["peak"].as_u64().unwrap() >= mem["allocated"].as_u64().unwrap());
        // The device's budget and this process's usage (lavapipe's: host memory).
        let (budget, usage) = (mem["device_budget"].as_u64().unwrap(), mem["device_usage"].as_u64().unwrap());
        assert!(budget > usage && usage >= mem["reserved"].as_u64().unwrap(), "{mem}");
    }
    let eval = lines.iter().find(|v| v.get("eval").is_some()).expect("an eval line");
    let acc = eval["eval"]["accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc));
    assert!(
        steps[5]["loss"].as_f64().unwrap() < steps[0]["loss"].as_f64().unwrap(),
        "loss should fall over 6 steps"
    );
}

#[test]
fn resume_matches_an_uninterrupted_run_step_for_step() {
    let dir = scratch("resume");
    let (full_log, part_log) = (dir.join("full.jsonl"), dir.join("part.jsonl"));
    let (full_ckpt, part_ckpt) = (dir.join("full"), dir.join("part"));
    // 2 epochs = 12 steps uninterrupted.
    let mut args = small_args(full_ckpt.to_str().unwrap(), &["--set", "train.epochs=2"]);
    args.extend(["--log".into(), full_log.display().to_string()]);
    run_ok(&args, &[]);
    // The same run stopped after 4 steps (mid-epoch), then resumed.
    let mut first = small_args(part_ckpt.to_str().unwrap(), &["--set", "train.epochs=2", "--set", "train.steps=4"]);
    first.extend(["--log".into(), part_log.display().to_string()]);
    run_ok(&first, &[]);
    let mut second = small_args(part_ckpt.to_str().unwrap(), &["--set", "train.epochs=2"]);
    second.extend([
        "--log".into(),
        part_log.display().to_string(),
        "--resume".into(),
        part_ckpt.display().to_string(),
    ]);
    run_ok(&second, &[]);
    let (full, part) = (losses(&full_log), losses(&part_log));
    assert_eq!(full.len(), 12);
    // train.steps=4 changes the schedule's horizon; with a constant schedule the steps
    // must agree exactly.
    assert_eq!(full, part, "losses differ after resume");
}

#[test]
fn a_corrupted_checkpoint_is_refused_naming_the_file() {
    let dir = scratch("corrupt");
    let ckpt = dir.join("ckpt");
    run_ok(&small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=2"]), &[]);
    let step_dir = ckpt.join(std::fs::read_to_string(ckpt.join("latest")).unwrap().trim());
    let model = step_dir.join("model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&model, &bytes).unwrap();
    let args = small_args(
        ckpt.to_str().unwrap(),
        &["--set", "train.steps=4", "--resume", ckpt.to_str().unwrap()],
    );
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = wgtrain(&refs, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model.safetensors is corrupt: sha256"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_save_killed_midway_leaves_the_previous_checkpoint_loadable() {
    let dir = scratch("killed");
    let ckpt = dir.join("ckpt");
    run_ok(&small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=2"]), &[]);
    let before = std::fs::read_to_string(ckpt.join("latest")).unwrap();
    // Resume to step 3; the save at the end aborts the process after its first file.
    let args = small_args(
        ckpt.to_str().unwrap(),
        &["--set", "train.steps=3", "--resume", ckpt.to_str().unwrap()],
    );
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = wgtrain(&refs, &[("WGTRAIN_TEST_CRASH_IN_SAVE", "1")]);
    assert!(!out.status.success(), "the save should have died");
    assert_eq!(
        std::fs::read_to_string(ckpt.join("latest")).unwrap(),
        before,
        "latest still names the old checkpoint"
    );
    assert!(!ckpt.join("step-000000003").exists());
    // The old checkpoint still loads and training continues from it.
    let out = run_ok(
        &small_args(
            ckpt.to_str().unwrap(),
            &["--set", "train.steps=3", "--resume", ckpt.to_str().unwrap()],
        ),
        &[],
    );
    assert!(out.contains("3 steps"), "{out}");
}

#[test]
fn config_errors_say_what_is_wrong() {
    let dir = scratch("config");
    let bad = dir.join("bad.toml");
    for (text, expect) in [
        ("[train]\nbatch_sise = 3\n", "unknown field `batch_sise`"),
        ("[train]\nlr = -1.0\n", "train.lr must be a positive number"),
        ("[train\n", "invalid config"),
        (
            "[data]\npath = \"/nonexistent/fashion\"\n",
            "Fashion-MNIST not found at /nonexistent/fashion",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let out = wgtrain(&["train", "--quiet", bad.to_str().unwrap()], &[]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "for {text:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = wgtrain(&["train", "--quiet", "--set", "train.lr"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not section.key=value"));
    let out = wgtrain(&["train", "--quiet", "/nonexistent.toml"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config /nonexistent.toml"));
}

#[test]
fn a_char_gpt_learns_below_the_unigram_entropy_of_its_text() {
    // A text with structure (sentences from a small grammar), so that a tiny GPT shows
    // within a minute on lavapipe that it learns context; the fortunes example is
    // measured on the H100 (CHANGELOG.md).
    let dir = scratch("chargpt");
    let corpus = dir.join("corpus.txt");
    let (subjects, verbs, objects) = (
        ["the cat", "a dog", "my robot", "our teacher"],
        ["eats", "paints", "finds", "sells"],
        ["red apples", "old maps", "blue boxes", "warm bread"],
    );
    write_sentences(&corpus, [&subjects, &verbs, &objects], 3000, 7);
    let log = dir.join("char.jsonl");
    let out = run_ok(
        &[
            "train",
            "--quiet",
            "examples/configs/char_gpt.toml",
            "--set",
            &format!("data.path=\"{}\"", corpus.display()),
            "--set",
            "model.n_layer=1",
            "--set",
            "model.n_embd=32",
            "--set",
            "model.n_head=2",
            "--set",
            "model.block_size=32",
            "--set",
            "train.batch_size=16",
            "--set",
            "train.steps=60",
            "--set",
            "train.eval_every=60",
            "--set",
            "train.warmup_steps=5",
            "--set",
            "train.lr=1e-2",
            "--set",
            "data.eval_limit=16",
            "--set",
            &format!("checkpoint.dir=\"{}\"", dir.join("ckpt").display()),
            "--log",
            log.to_str().unwrap(),
        ]
        .map(String::from),
        &[],
    );
    let number = |s: &str| {
        s.chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect::<String>()
            .parse::<f64>()
            .ok()
    };
    let entropy = out
        .split("unigram entropy of the text: ")
        .nth(1)
        .and_then(number)
        .expect("entropy printed");
    let eval = out.split("eval loss ").nth(1).and_then(number).expect("eval loss printed");
    assert!(
        eval < entropy - 0.5,
        "eval loss {eval} is not well below the unigram entropy {entropy}"
    );
}

#[test]
fn ctrl_c_finishes_the_step_saves_and_exits() {
    let dir = scratch("ctrlc");
    let ckpt = dir.join("ckpt");
    let log = dir.join("run.jsonl");
    let mut args = small_args(
        ckpt.to_str().unwrap(),
        &["--set", "train.steps=100000", "--set", "train.eval_every=1000000"],
    );
    args.extend(["--log".into(), log.display().to_string()]);
    let child = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while std::fs::read_to_string(&log).map(|t| t.lines().count()).unwrap_or(0) < 3 {
        assert!(start.elapsed().as_secs() < 120, "no steps logged");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    // Interrupted is not finished: 128 + SIGINT, as shells report it.
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("(interrupted)"), "{stdout}");
    let steps = losses(&log).len() as u64;
    let latest = std::fs::read_to_string(ckpt.join("latest")).unwrap();
    assert_eq!(
        latest.trim(),
        format!("step-{steps:09}"),
        "the checkpoint holds the last finished step"
    );
}

#[test]
fn token_files_train_and_bad_tokens_are_refused() {
    let dir = scratch("tokens");
    let write = |name: &str, tokens: &[u16]| {
        std::fs::write(dir.join(name), tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap()
    };
    let tokens: Vec<u16> = (0..4000u32).map(|i| (i * 7 % 50) as u16).collect();
    write("train.bin", &tokens);
    write("val.bin", &tokens[..1000]);
    let base = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "train",
            "--quiet",
            "--set",
            "model.kind=\"gpt\"",
            "--set",
            "data.kind=\"tokens\"",
            "--set",
            "model.vocab_size=50",
            "--set",
            "model.n_layer=1",
            "--set",
            "model.n_head=2",
            "--set",
            "model.n_embd=16",
            "--set",
            "model.block_size=16",
            "--set",
            "train.batch_size=4",
            "--set",
            "train.steps=3",
            "--set",
            "data.eval_limit=4",
        ]
        .map(String::from)
        .to_vec();
        a.extend(["--set".into(), format!("data.path=\"{}\"", dir.display())]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let out = run_ok(&base(&[]), &[]);
    assert!(out.contains("3 steps"), "{out}");
    write("val.bin", &[1, 2, 60, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
    let args = base(&[]);
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = wgtrain(&refs, &[]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("token 60 at position 2 is not below model.vocab_size 50"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn optimizer_in_backward_gives_the_same_losses_with_a_lower_peak() {
    let dir = scratch("oib");
    let corpus = dir.join("corpus.txt");
    let text: String = (0..2000).map(|i| format!("line {} says {}.\n", i % 17, (i * 7) % 23)).collect();
    std::fs::write(&corpus, text).unwrap();
    let run = |oib: bool| -> (Vec<f64>, u64) {
        let log = dir.join(format!("oib-{oib}.jsonl"));
        let _ = std::fs::remove_file(&log);
        run_ok(
            &[
                "train",
                "--quiet",
                "examples/configs/char_gpt.toml",
                "--set",
                &format!("data.path=\"{}\"", corpus.display()),
                "--set",
                "model.n_layer=2",
                "--set",
                "model.n_embd=64",
                "--set",
                "model.n_head=2",
                "--set",
                "model.block_size=16",
                "--set",
                "train.batch_size=4",
                "--set",
                "train.steps=4",
                "--set",
                "train.eval_every=100",
                "--set",
                "train.grad_clip=0",
                "--set",
                "data.eval_limit=4",
                "--set",
                &format!("memory.optimizer_in_backward={oib}"),
                "--set",
                &format!("checkpoint.dir=\"{}\"", dir.join(format!("ckpt-{oib}")).display()),
                "--log",
                log.to_str().unwrap(),
            ]
            .map(String::from),
            &[],
        );
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let steps: Vec<&serde_json::Value> = lines.iter().filter(|v| v.get("mem").is_some()).collect();
        (
            steps.iter().map(|s| s["loss"].as_f64().unwrap()).collect(),
            steps.iter().map(|s| s["mem"]["peak"].as_u64().unwrap()).max().unwrap(),
        )
    };
    let (plain, in_backward) = (run(false), run(true));
    assert_eq!(plain.0, in_backward.0, "the same updates, applied earlier");
    assert!(in_backward.1 < plain.1, "peak {} should be below {}", in_backward.1, plain.1);
    // Refused where it cannot hold.
    let out = wgtrain(
        &[
            "train",
            "--quiet",
            "--set",
            "memory.optimizer_in_backward=true",
            "--set",
            "train.grad_clip=1.0",
        ],
        &[],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be combined with train.grad_clip"));
    let out = wgtrain(
        &[
            "train",
            "--quiet",
            "--set",
            "memory.optimizer_in_backward=true",
            "--set",
            "train.micro_batch_size=8",
        ],
        &[],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be combined with gradient accumulation"));
}

#[test]
fn a_fresh_run_never_appends_to_another_runs_log() {
    let dir = scratch("logreuse");
    let log = dir.join("run.jsonl");
    let ckpt = dir.join("ckpt");
    let mut args = small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=2"]);
    args.extend(["--log".into(), log.display().to_string()]);
    run_ok(&args, &[]);
    let first = std::fs::read_to_string(&log).unwrap();
    assert_eq!(losses(&log).len(), 2);
    // Again onto the same log: refused before training, the log untouched.
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = wgtrain(&refs, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already holds a run") && err.contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), first);
    // With --overwrite: a new run in its place, not appended.
    args.push("--overwrite".into());
    run_ok(&args, &[]);
    let steps: Vec<u64> = losses(&log).iter().map(|l| l.0).collect();
    assert_eq!(steps, [1, 2]);
}

/// `--dashboard` keeps serving the finished run, terminal or not (stdin here is not
/// one), until Ctrl-C, which then ends it as a finished run (0); `--exit-when-done` ends
/// with training.
#[test]
fn the_dashboard_outlives_training_until_ctrl_c_unless_asked_not_to() {
    use std::io::{BufRead, Read, Write};
    let dir = scratch("dashboard-stays");
    let mut args = small_args(dir.join("ckpt").to_str().unwrap(), &["--set", "train.steps=3"]);
    args.extend(["--dashboard".into(), "127.0.0.1:0".into()]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut url = None;
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 {
        if let Some(u) = line.trim().strip_prefix("training finished; the dashboard stays at ") {
            url = Some(u.trim_end_matches(" until Ctrl-C").to_string());
            break;
        }
        line.clear();
    }
    let url = url.expect("the dashboard is said to stay");
    // Still answering after training.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let host = url.trim_start_matches("http://").split('/').next().unwrap().to_string();
    let mut s = std::net::TcpStream::connect(&host).unwrap();
    write!(s, "GET /api/health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200") && reply.contains("\"ok\":true"), "{reply}");
    assert!(child.try_wait().unwrap().is_none(), "still serving");
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert_eq!(child.wait().unwrap().code(), Some(0), "a finished run ends well");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("Ctrl-C: training is done; closing the dashboard"), "{rest}");

    // Asked not to: it ends with training.
    args.push("--exit-when-done".into());
    args.push("--overwrite".into());
    let out = wgtrain(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("stays at"));
}

/// Off a terminal (a pipe, the quick start's log), progress is plain lines: why the
/// first step is slow before it, then the steps and every evaluation.
#[test]
fn progress_off_a_terminal_says_why_step_one_is_slow_and_every_evaluation() {
    let dir = scratch("progress-lines");
    let mut args = small_args(
        dir.join("ckpt").to_str().unwrap(),
        &["--set", "train.steps=6", "--set", "train.eval_every=3"],
    );
    args.retain(|a| a != "--quiet");
    let out = wgtrain(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[("TERM", "dumb")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let compile = err.find("step 1 also compiles the GPU kernels").expect("the compile line");
    let first = err.find("step 1/6").expect("step 1's line");
    assert!(compile < first, "{err}");
    assert_eq!(err.matches(": eval loss ").count(), 2, "{err}");
}

/// On a terminal (a pseudo-terminal from util-linux's `script`, as a user's shell
/// gives): the progress bar draws, and every evaluation, the compile line and the
/// checkpoint's path are printed as lines the bar does not swallow.
#[test]
fn on_a_terminal_the_bar_draws_and_no_line_is_swallowed() {
    let dir = scratch("progress-pty");
    let mut args = small_args(
        dir.join("ckpt").to_str().unwrap(),
        &["--set", "train.steps=6", "--set", "train.eval_every=3"],
    );
    args.retain(|a| a != "--quiet");
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_wgtrain").to_string())
        .chain(args)
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    let out = Command::new("script")
        .args(["-qefc", &quoted.join(" "), "/dev/null"])
        .env("TERM", "xterm-256color")
        .env("COLUMNS", "120")
        .output()
        .expect("script (util-linux) runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    // indicatif redraws the bar in place: carriage returns or cursor moves.
    assert!(text.contains('\r') || text.contains("\x1b["), "no bar drawn: {text:?}");
    assert!(text.contains("step 1 also compiles the GPU kernels"), "{text}");
    for step in [3, 6] {
        assert_eq!(text.matches(&format!("step {step}: eval loss")).count(), 1, "{text}");
    }
    assert!(text.contains("checkpoint ") && text.contains("step-000000006"), "{text}");
}

/// The Python with TensorBoard that `./quickstart.sh test` makes (target/tensorboard-venv),
/// or `WGTRAIN_TENSORBOARD_PYTHON`.
fn tensorboard_python() -> std::path::PathBuf {
    let path = std::env::var_os("WGTRAIN_TENSORBOARD_PYTHON").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tensorboard-venv/bin/python"),
        std::path::PathBuf::from,
    );
    assert!(
        path.is_file(),
        "{} is missing: ./quickstart.sh test installs TensorBoard there (or set WGTRAIN_TENSORBOARD_PYTHON)",
        path.display()
    );
    path
}

#[test]
fn tensorboards_own_reader_reads_every_step_and_evaluation() {
    let dir = scratch("tensorboard");
    let log = dir.join("run.jsonl");
    let tb = dir.join("tb");
    let mut args = small_args(
        dir.join("ckpt").to_str().unwrap(),
        &[
            "--set",
            "train.steps=12",
            "--set",
            "train.eval_every=6",
            "--set",
            "train.grad_clip=1.0",
        ],
    );
    args.extend([
        "--log".into(),
        log.display().to_string(),
        "--tensorboard".into(),
        tb.display().to_string(),
    ]);
    run_ok(&args, &[]);
    // TensorBoard's EventAccumulator checks each record's CRC-32C and drops a bad one.
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
"#;
    let out = Command::new(tensorboard_python()).args(["-c", script]).arg(&tb).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let series = |tag: &str| -> Vec<(u64, f32)> {
        read[tag]
            .as_array()
            .unwrap_or_else(|| panic!("no {tag} in {read}"))
            .iter()
            .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap() as f32))
            .collect()
    };
    let from_log = |get: &dyn Fn(&serde_json::Value) -> Option<f64>| -> Vec<(u64, f32)> {
        lines
            .iter()
            .filter_map(|v| get(v).map(|x| (v["step"].as_u64().unwrap(), x as f32)))
            .collect()
    };
    let loss = from_log(&|v| v.get("loss").and_then(|l| l.as_f64()));
    assert_eq!(loss.len(), 12);
    assert_eq!(series("train/loss"), loss);
    assert_eq!(series("train/lr"), from_log(&|v| v.get("lr").and_then(|l| l.as_f64())));
    let acc = from_log(&|v| v.pointer("/eval/accuracy").and_then(|l| l.as_f64()));
    assert_eq!(acc.len(), 2);
    assert_eq!(series("eval/accuracy"), acc);
    let norm = from_log(&|v| v.get("grad_norm").and_then(|l| l.as_f64()));
    assert_eq!(norm.len(), 12);
    assert_eq!(series("train/grad_norm"), norm);
    let peak = from_log(&|v| v.pointer("/mem/peak").and_then(|b| b.as_u64()).map(|b| b as f64 / 1048576.0));
    assert_eq!(series("memory/peak_mib"), peak);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint's model tensors by name (f32).
fn model_tensors(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| (name, bytemuck::pod_collect_to_vec::<u8, f32>(v.data())))
        .collect()
}

#[test]
fn the_logged_update_ratio_is_each_layers_change_over_its_weights_between_checkpoints() {
    let dir = scratch("update-ratio");
    let run = |name: &str, extra: &[&str]| {
        let log = dir.join(format!("{name}.jsonl"));
        let ckpt = dir.join(format!("{name}.ckpt"));
        let mut sets = vec!["--set", "train.steps=3", "--set", "checkpoint.every=1"];
        sets.extend(extra);
        let mut args = small_args(ckpt.to_str().unwrap(), &sets);
        args.extend(["--log".into(), log.display().to_string()]);
        run_ok(&args, &[]);
        (log, ckpt)
    };
    let (log, ckpt) = run(
        "measured",
        &["--set", "train.log_update_ratio=true", "--set", "train.log_gpu_busy=false"],
    );
    let (plain, _) = run("plain", &[]);
    assert_eq!(losses(&log), losses(&plain), "measuring changes no step");
    // GPU busy on every step by default (lavapipe has timestamps), none when off.
    for v in step_lines(&plain) {
        let (gpu, wall) = (v["gpu_ms"].as_f64(), v["step_ms"].as_f64().unwrap());
        let gpu = gpu.unwrap_or_else(|| panic!("no gpu_ms: {v}"));
        assert!(gpu > 0.0 && gpu <= wall * 1.05, "GPU busy {gpu} ms of a {wall} ms step");
    }
    assert!(!std::fs::read_to_string(&log).unwrap().contains("gpu_ms"));
    let lines = step_lines(&log);
    for step in [2u64, 3] {
        let before = model_tensors(&ckpt.join(format!("step-{:09}", step - 1)));
        let after = model_tensors(&ckpt.join(format!("step-{step:09}")));
        let logged = &lines[step as usize - 1]["update_ratio"];
        for layer in ["layers.0", "layers.1"] {
            let (mut du, mut w) = (0.0f64, 0.0f64);
            for (name, new) in after.iter().filter(|(n, _)| n.starts_with(&format!("{layer}."))) {
                for (a, b) in new.iter().zip(&before[name]) {
                    du += (*a as f64 - *b as f64).powi(2);
                    w += (*a as f64).powi(2);
                }
            }
            let want = (du / w).sqrt();
            let got = logged[layer]
                .as_f64()
                .unwrap_or_else(|| panic!("step {step}: no {layer} in {logged}"));
            assert!(
                (got - want).abs() <= 1e-3 * want,
                "step {step} {layer}: logged {got}, checkpoints {want}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_pipeline_cache_is_kept_on_disk_and_a_damaged_one_is_ignored() {
    let dir = scratch("pipeline-cache");
    let cache = dir.join("xdg");
    let train = |env: &[(&str, &str)]| {
        let args = small_args(dir.join("ckpt").to_str().unwrap(), &["--set", "train.steps=2", "--overwrite"]);
        let mut all: Vec<(&str, &str)> = vec![("XDG_CACHE_HOME", cache.to_str().unwrap())];
        all.extend(env);
        run_ok(&args, &all);
    };
    let files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(cache.join("wgtrain"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    train(&[("WGTRAIN_PIPELINE_CACHE", "0")]);
    assert!(files().is_empty(), "turned off, nothing is written: {:?}", files());
    train(&[]);
    let kept = files();
    assert_eq!(kept.len(), 1, "one file for the adapter: {kept:?}");
    let name = kept[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("wgpu_pipeline_cache_"), "{name}");
    // A damaged file (another driver's, a cut write) is refused by the driver, not
    // trusted: the run goes on and writes a good one.
    std::fs::write(&kept[0], b"not a pipeline cache").unwrap();
    train(&[]);
    assert_ne!(std::fs::read(&kept[0]).unwrap(), b"not a pipeline cache");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn eval_from_a_checkpoint_alone_equals_the_runs_last_evaluation() {
    let dir = scratch("eval-command");
    let ckpt = dir.join("ck");
    let log = dir.join("run.jsonl");
    let mut args = small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=12", "--set", "checkpoint.every=6"]);
    args.extend(["--log".into(), log.display().to_string()]);
    run_ok(&args, &[]);
    let last_eval: serde_json::Value = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("eval").is_some())
        .last()
        .unwrap()["eval"]
        .clone();
    let out = wgtrain(&["eval", "--checkpoint", ckpt.to_str().unwrap(), "--json"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The same weights, split and batches: the same numbers to the bit.
    assert_eq!(got["loss"], last_eval["loss"]);
    assert_eq!(got["accuracy"], last_eval["accuracy"]);
    assert_eq!(got["step"], 12);
    // Its own peak: below the run's evaluation's, the optimizer's state not loaded (AdamW's
    // two moments: 8 bytes a parameter of this 784-32-10 MLP).
    let (peak, run_peak) = (got["peak"].as_i64().unwrap(), last_eval["peak"].as_i64().unwrap());
    let moments = 8 * (784 * 32 + 32 + 32 * 10 + 10);
    assert!(peak > 0 && (run_peak - peak - moments).abs() <= 4096, "{peak} vs {run_peak}");
    // An override of what makes the model is refused by name.
    let out = wgtrain(&["eval", "--checkpoint", ckpt.to_str().unwrap(), "--set", "model.hidden=[64]"], &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("model.hidden"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `data.kind = "lines"`: a text's lines as examples of their own lengths, padded to
/// each batch's longest and batched by length. The run learns; its steps' peaks differ
/// with their lengths, the largest equal to the estimate (which takes the longest
/// examples); the allocator's reserved memory, which the cache keeps across the
/// shapes, is logged beside it.
#[test]
fn lines_of_their_own_lengths_train_padded_and_bucketed() {
    let dir = scratch("lines");
    let text = dir.join("lines.txt");
    let words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"];
    let mut body = String::new();
    let mut state = 5u64;
    for _ in 0..600 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = 1 + (state >> 40) as usize % 6;
        let line: Vec<&str> = (0..n).map(|k| words[(state >> (8 + 3 * k)) as usize % 8]).collect();
        body += &line.join(" ");
        body.push('\n');
    }
    std::fs::write(&text, body).unwrap();
    let log = dir.join("run.jsonl");
    let sets = [
        "model.kind=\"gpt\"".to_string(),
        "data.kind=\"lines\"".into(),
        format!("data.path=\"{}\"", text.display()),
        "model.n_layer=1".into(),
        "model.n_head=2".into(),
        "model.n_embd=32".into(),
        "model.block_size=48".into(),
        "train.batch_size=16".into(),
        "train.lr=3e-3".into(),
        "train.eval_every=0".into(),
        format!("checkpoint.dir=\"{}\"", dir.join("ck").display()),
    ];
    let mut args = vec!["train".to_string(), "--quiet".into(), "--set".into(), "train.steps=40".into()];
    for s in &sets {
        args.extend(["--set".to_string(), s.clone()]);
    }
    args.extend(["--log".into(), log.display().to_string()]);
    run_ok(&args, &[]);
    let steps = step_lines(&log);
    let loss = |s: &[serde_json::Value]| s.iter().map(|v| v["loss"].as_f64().unwrap()).sum::<f64>() / s.len() as f64;
    assert!(
        loss(&steps[30..]) < 0.8 * loss(&steps[..5]),
        "{} -> {}",
        loss(&steps[..5]),
        loss(&steps[30..])
    );
    let peaks: Vec<u64> = steps.iter().map(|v| v["mem"]["peak"].as_u64().unwrap()).collect();
    let (least, most) = (peaks[1..].iter().min().unwrap(), peaks.iter().max().unwrap());
    assert!(least < most, "the steps' shapes differ: {peaks:?}");
    let mut est = vec!["estimate".to_string(), "--json".into()];
    for s in &sets {
        est.extend(["--set".to_string(), s.clone()]);
    }
    let est: serde_json::Value = serde_json::from_str(&run_ok(&est, &[])).unwrap();
    assert_eq!(
        est["peak_bytes"].as_u64().unwrap(),
        *most,
        "the longest batch's step is the estimate's"
    );
    for v in &steps {
        let m = &v["mem"];
        assert!(m["reserved"].as_u64().unwrap() >= m["allocated"].as_u64().unwrap());
        assert!(m["fragmentation"].as_f64().unwrap() >= 0.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
