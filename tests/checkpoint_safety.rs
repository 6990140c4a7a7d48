//! No lost work on crashes and signals, by real processes: a save killed at each of its
//! points while replacing an existing step, a fresh run refused over another run's
//! checkpoints, a bad checkpoint folder refused before training, one trainer per
//! folder, SIGTERM and SIGINT saving and exiting 143 and 130, logs repaired on resume,
//! stale temporary folders removed, and a loop of 50 kills (SIGKILL at random moments
//! and aborts at each rename) after which the log equals an uninterrupted run's.

mod cli;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli::{losses, run_ok, scratch, small_args, wgtrain};
use wgtrain_engine::train::checkpoint::CRASH_POINTS;

fn with_log(mut args: Vec<String>, log: &Path) -> Vec<String> {
    args.extend(["--log".into(), log.display().to_string()]);
    args
}

fn resume(mut args: Vec<String>, ckpt: &Path) -> Vec<String> {
    args.extend(["--resume".into(), ckpt.display().to_string()]);
    args
}

fn run(args: &[String], env: &[(&str, &str)]) -> std::process::Output {
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    wgtrain(&refs, env)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn resaving_an_existing_step_survives_a_crash_at_every_point() {
    for point in CRASH_POINTS {
        let dir = scratch(&format!("resave-{point}"));
        let ckpt = dir.join("ckpt");
        let c = ckpt.to_str().unwrap();
        run_ok(&small_args(c, &["--set", "train.steps=3"]), &[]);
        // Resuming the finished run saves step 3 again: die at `point` of that save.
        let out = run(
            &resume(small_args(c, &["--set", "train.steps=3"]), &ckpt),
            &[("WGTRAIN_TEST_CRASH_AT", point)],
        );
        assert!(!out.status.success(), "{point}: the save should have died");
        // The checkpoint is whole: resume works and continues to the end.
        let text = run_ok(&resume(small_args(c, &["--set", "train.steps=5"]), &ckpt), &[]);
        assert!(text.contains("5 steps"), "{point}: {text}");
        let names: Vec<String> = std::fs::read_dir(&ckpt)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.contains(".tmp-") || n.contains(".old-")),
            "{point}: left over {names:?}"
        );
    }
}

#[test]
fn a_fresh_run_never_replaces_another_runs_checkpoints() {
    let dir = scratch("fresh");
    let ckpt = dir.join("ckpt");
    let c = ckpt.to_str().unwrap();
    run_ok(&small_args(c, &["--set", "train.steps=2"]), &[]);
    let before = std::fs::read(ckpt.join("step-000000002/model.safetensors")).unwrap();
    // Another model shape into the same folder, without --resume: refused, untouched.
    let out = run(&small_args(c, &["--set", "train.steps=2", "--set", "model.hidden=[16]"]), &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("holds checkpoints of another run"), "{}", stderr(&out));
    assert!(stderr(&out).contains("--overwrite"), "{}", stderr(&out));
    assert_eq!(std::fs::read(ckpt.join("step-000000002/model.safetensors")).unwrap(), before);
    // Asked for explicitly, it replaces them.
    let mut args = small_args(c, &["--set", "train.steps=1", "--set", "model.hidden=[16]"]);
    args.push("--overwrite".into());
    run_ok(&args, &[]);
    assert!(!ckpt.join("step-000000002").exists());
    assert!(ckpt.join("step-000000001/manifest.json").is_file());
}

#[test]
fn an_unusable_checkpoint_folder_is_refused_before_training() {
    let dir = scratch("unusable");
    let file = dir.join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    for target in [file.clone(), file.join("below")] {
        let log = dir.join("run.jsonl");
        let _ = std::fs::remove_file(&log);
        let start = Instant::now();
        let out = run(
            &with_log(small_args(target.to_str().unwrap(), &["--set", "train.steps=50"]), &log),
            &[],
        );
        assert!(!out.status.success());
        assert!(stderr(&out).contains("cannot be used"), "{}", stderr(&out));
        assert!(losses_or_none(&log).is_empty(), "trained before refusing");
        assert!(start.elapsed() < Duration::from_secs(60));
    }
    // One trainer at a time: a live holder's lock is refused, naming its pid.
    let ckpt = dir.join("locked");
    std::fs::create_dir_all(&ckpt).unwrap();
    let holder = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(ckpt.join(".lock"), holder.id().to_string()).unwrap();
    let out = run(&small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=1"]), &[]);
    assert!(stderr(&out).contains(&format!("pid {}", holder.id())), "{}", stderr(&out));
    kill(holder.id(), "KILL");
    let mut holder = holder;
    holder.wait().unwrap();
    // A dead holder's lock is taken over.
    run_ok(&small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=1"]), &[]);
    assert!(!ckpt.join(".lock").exists(), "the lock goes with the run");
}

fn losses_or_none(log: &Path) -> Vec<(u64, f64)> {
    if log.exists() { losses(log) } else { Vec::new() }
}

fn kill(pid: u32, signal: &str) {
    let status = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status().unwrap();
    assert!(status.success());
}

fn spawn(args: &[String], env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgtrain"));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn wait_for_lines(log: &Path, n: usize) {
    let start = Instant::now();
    while std::fs::read_to_string(log).map(|t| t.lines().count()).unwrap_or(0) < n {
        assert!(start.elapsed() < Duration::from_secs(120), "no steps logged");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_and_sigint_finish_the_step_save_and_exit_143_and_130() {
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let dir = scratch(&format!("signal-{signal}"));
        let (ckpt, log) = (dir.join("ckpt"), dir.join("run.jsonl"));
        let args = with_log(
            small_args(
                ckpt.to_str().unwrap(),
                &["--set", "train.steps=100000", "--set", "train.eval_every=1000000"],
            ),
            &log,
        );
        let child = spawn(&args, &[]);
        wait_for_lines(&log, 2);
        kill(child.id(), signal);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "SIG{signal}: {}", stderr(&out));
        let steps = losses(&log).len() as u64;
        let latest = std::fs::read_to_string(ckpt.join("latest")).unwrap();
        assert_eq!(
            latest.trim(),
            format!("step-{steps:09}"),
            "SIG{signal}: the checkpoint holds the last step"
        );
        // And the run resumes from it.
        let args = resume(
            small_args(ckpt.to_str().unwrap(), &["--set", &format!("train.steps={}", steps + 1)]),
            &ckpt,
        );
        run_ok(&args, &[]);
    }
}

#[test]
fn logs_are_repaired_on_resume_and_stale_temporary_folders_removed() {
    let dir = scratch("logs");
    let (ckpt, log) = (dir.join("ckpt"), dir.join("run.jsonl"));
    let c = ckpt.to_str().unwrap();
    let full_log = dir.join("full.jsonl");
    run_ok(
        &with_log(
            small_args(dir.join("full").to_str().unwrap(), &["--set", "train.steps=6"]),
            &full_log,
        ),
        &[],
    );
    // Six steps with checkpoints every 3, then a resume from step 3 (as after a kill
    // that lost steps 4-6's checkpoint): steps 4-6 must not appear twice.
    run_ok(
        &with_log(small_args(c, &["--set", "train.steps=6", "--set", "checkpoint.every=3"]), &log),
        &[],
    );
    // A write cut short (a full disk, a kill mid-line) left half a line.
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"step\": 7, \"epo");
    std::fs::write(&log, text).unwrap();
    // Leftovers of killed saves.
    std::fs::create_dir_all(ckpt.join(".step-000000009.tmp-999999")).unwrap();
    std::fs::write(ckpt.join(".step-000000009.tmp-999999/model.safetensors"), vec![0u8; 4096]).unwrap();
    std::fs::write(ckpt.join(".latest.tmp-999999"), b"step-000000009").unwrap();
    run_ok(
        &resume(
            with_log(small_args(c, &["--set", "train.steps=6"]), &log),
            &ckpt.join("step-000000003"),
        ),
        &[],
    );
    let steps: Vec<u64> = losses(&log).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "each step once");
    assert_eq!(losses(&log), losses(&full_log), "the resumed log equals an uninterrupted run's");
    // Every line parses, so the dashboard reads the run.
    wgtrain_web::recorder::load_run(&log).expect("the dashboard reads the repaired log");
    assert!(!ckpt.join(".step-000000009.tmp-999999").exists());
    assert!(!ckpt.join(".latest.tmp-999999").exists());
}

/// The command after a kill: `--resume` once the folder holds a checkpoint; before
/// that (killed before its first save finished) the run starts over, log included.
fn next_run(base: &[String], ckpt: &Path, log: &Path) -> Vec<String> {
    let saved = std::fs::read_dir(ckpt)
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("step-")))
        .unwrap_or(false);
    if saved {
        resume(base.to_vec(), ckpt)
    } else {
        let _ = std::fs::remove_file(log);
        base.to_vec()
    }
}

/// A deterministic sequence for the kill loop.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn fifty_kills_and_resumes_end_with_the_uninterrupted_runs_losses() {
    const STEPS: u64 = 12;
    const KILLS: usize = 50;
    let dir = scratch("killloop");
    let extra = [
        "--set",
        "train.steps=12",
        "--set",
        "checkpoint.every=1",
        "--set",
        "train.eval_every=1000000",
    ];
    let reference = dir.join("reference.jsonl");
    run_ok(&with_log(small_args(dir.join("ref").to_str().unwrap(), &extra), &reference), &[]);
    let want = losses(&reference);
    assert_eq!(want.len() as u64, STEPS);
    // How long a whole run takes here, to spread the kills over it.
    let start = Instant::now();
    run_ok(&small_args(dir.join("timing").to_str().unwrap(), &extra), &[]);
    let run_ms = start.elapsed().as_millis() as u64;

    let (ckpt, log) = (dir.join("ckpt"), dir.join("run.jsonl"));
    let base = with_log(small_args(ckpt.to_str().unwrap(), &extra), &log);
    let mut rng = Lcg(2026);
    let (mut sigkills, mut aborts, mut finished_resumes_killed, mut cycles, mut missed) = (0, 0, 0, 0, 0);
    let check_and_start_over = |cycles: &mut usize| {
        assert_eq!(
            losses(&log),
            want,
            "cycle {cycles}: the log after its kills equals an uninterrupted run's"
        );
        *cycles += 1;
        std::fs::remove_dir_all(&ckpt).unwrap();
        std::fs::remove_file(&log).unwrap();
    };
    while sigkills + aborts < KILLS {
        let args = next_run(&base, &ckpt, &log);
        let saved = saved_step(&ckpt);
        if saved == Some(STEPS) {
            // A resume of the finished run: it saves step 12 again; die at one of that
            // save's points, then resume once more and compare.
            let point = CRASH_POINTS[finished_resumes_killed % CRASH_POINTS.len()];
            let out = run(&args, &[("WGTRAIN_TEST_CRASH_AT", &format!("{point}@{STEPS}"))]);
            assert!(out.status.code().is_none(), "re-save at {point}: {}", stderr(&out));
            aborts += 1;
            finished_resumes_killed += 1;
            run_ok(&next_run(&base, &ckpt, &log), &[]);
            check_and_start_over(&mut cycles);
            continue;
        }
        if rng.next(3) == 0 {
            // An abort at one of the save's points, at a step still to be saved (a new
            // step's save has every point but moving an old folder aside).
            let points: Vec<&str> = CRASH_POINTS.into_iter().filter(|p| *p != "old-aside").collect();
            let point = points[rng.next(points.len() as u64) as usize];
            let first = saved.map_or(1, |s| s + 1);
            let at = format!("{point}@{}", first + rng.next(STEPS - first + 1));
            let out = run(&args, &[("WGTRAIN_TEST_CRASH_AT", &at)]);
            assert!(
                out.status.code().is_none(),
                "abort at {at}: exit {:?}: {}",
                out.status.code(),
                stderr(&out)
            );
            aborts += 1;
        } else {
            // SIGKILL at a random moment of the run (start-up and saves included).
            let mut child = spawn(&args, &[]);
            std::thread::sleep(Duration::from_millis(rng.next(run_ms.max(1))));
            match child.try_wait().unwrap() {
                Some(status) => {
                    let out = child.wait_with_output().unwrap();
                    assert!(status.success(), "exit {status}: {}", stderr(&out));
                    missed += 1;
                }
                None => {
                    kill(child.id(), "KILL");
                    let out = child.wait_with_output().unwrap();
                    assert!(out.status.code().is_none_or(|c| c == 0), "{}", stderr(&out));
                    sigkills += 1;
                }
            }
        }
    }
    // Whatever state the kills left, resume works and completes the run.
    run_ok(&next_run(&base, &ckpt, &log), &[]);
    check_and_start_over(&mut cycles);
    eprintln!(
        "kill loop: {} kills ({sigkills} SIGKILL at random moments, {aborts} aborts at save points, {finished_resumes_killed} of them in resumes of finished runs), {missed} runs finished before their kill, {cycles} runs completed and equal to the uninterrupted one",
        sigkills + aborts
    );
}

/// The step of the folder's newest whole checkpoint.
fn saved_step(ckpt: &Path) -> Option<u64> {
    wgtrain_engine::train::checkpoint::resolve(ckpt).ok().and_then(|p| {
        wgtrain_engine::train::checkpoint::parse_step_dir(p.file_name()?.to_str()?.trim_start_matches('.').split(".old-").next()?)
    })
}
