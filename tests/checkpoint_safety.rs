//! No lost work on crashes and signals, by real processes: a save killed at each of its
//! points while replacing an existing step, a fresh run refused over another run's
//! checkpoints, a resume refused into another run's folder or log, an edited manifest
//! or `latest` refused, a bad checkpoint folder refused before training, one trainer
//! per folder (a kernel lock), SIGTERM, SIGINT and SIGHUP saving and exiting 143, 130
//! and 129 (nothing saved before the first step), logs repaired on resume, stale
//! temporary folders removed, and a loop of 50 kills (SIGKILL at random moments and
//! aborts at each rename, some runs as pid 1 of a pid namespace) after which the log
//! equals an uninterrupted run's.

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
        run_ok(&small_args(c, &["--set", "train.steps=3", "--set", "checkpoint.every=1"]), &[]);
        // Resuming the finished run from its step 2 saves step 3 again: die at `point`
        // of that save.
        let out = run(
            &resume(small_args(c, &["--set", "train.steps=3"]), &ckpt.join("step-000000002")),
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
    // One trainer at a time: a live holder's lock (flock, held by the kernel) is
    // refused, naming the pid the file holds.
    let ckpt = dir.join("locked");
    std::fs::create_dir_all(&ckpt).unwrap();
    let lock = ckpt.join(".lock");
    // `-o`: flock itself holds the lock, not the command it runs.
    let holder = Command::new("flock").arg("-o").arg(&lock).args(["sleep", "30"]).spawn().unwrap();
    let start = Instant::now();
    while std::fs::File::open(&lock).is_ok_and(|f| f.try_lock().is_ok()) {
        assert!(start.elapsed() < Duration::from_secs(10), "flock never took the lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(&lock, holder.id().to_string()).unwrap();
    let out = run(&small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=1"]), &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&format!("pid {}", holder.id())), "{}", stderr(&out));
    kill(holder.id(), "KILL");
    let mut holder = holder;
    holder.wait().unwrap();
    // A dead holder's lock is taken over, whatever pid the file names: even this
    // test's own, which is alive.
    std::fs::write(&lock, std::process::id().to_string()).unwrap();
    run_ok(&small_args(ckpt.to_str().unwrap(), &["--set", "train.steps=1"]), &[]);
    let file = std::fs::File::open(&lock).unwrap();
    file.try_lock().expect("the lock goes with the run");
}

fn losses_or_none(log: &Path) -> Vec<(u64, f64)> {
    if log.exists() { losses(log) } else { Vec::new() }
}

fn kill(pid: u32, signal: &str) {
    let status = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status().unwrap();
    assert!(status.success());
}

fn spawn(args: &[String], env: &[(&str, &str)]) -> std::process::Child {
    spawn_in(args, env, false)
}

/// The command running `wgtrain ARGS`: as pid 1 of a new pid namespace (as in a
/// container) where `pid1` (`unshare`, the trainer killed with it).
fn command(args: &[String], pid1: bool) -> Command {
    let exe = env!("CARGO_BIN_EXE_wgtrain");
    let mut cmd = if pid1 {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child", exe]);
        c
    } else {
        Command::new(exe)
    };
    cmd.args(args);
    cmd
}

fn spawn_in(args: &[String], env: &[(&str, &str)], pid1: bool) -> std::process::Child {
    let mut cmd = command(args, pid1);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
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
fn sigterm_sigint_and_sighup_finish_the_step_save_and_exit_143_130_and_129() {
    for (signal, code) in [("TERM", 143), ("INT", 130), ("HUP", 129)] {
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
        // The exact command that resumes it.
        let says = format!(
            "resume with: wgtrain train --log {} --resume {}",
            log.display(),
            ckpt.join("step-").display()
        );
        assert!(stderr(&out).contains(&says), "SIG{signal}: {}", stderr(&out));
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
    let (mut sigkills, mut aborts, mut finished_resumes_killed, mut cycles, mut missed, mut as_pid1) = (0, 0, 0, 0, 0, 0);
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
    let output = |args: &[String], env: &[(&str, &str)], pid1: bool| {
        let mut cmd = command(args, pid1);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let ok = |out: &std::process::Output| assert!(out.status.success(), "{}", stderr(out));
    while sigkills + aborts < KILLS {
        let args = next_run(&base, &ckpt, &log);
        let saved = saved_step(&ckpt);
        // Every third run is pid 1 of its own pid namespace, as a trainer in a container
        // is: its pid comes back after a kill.
        let pid1 = rng.next(3) == 0;
        as_pid1 += usize::from(pid1);
        if saved == Some(STEPS) {
            // The run finished: resuming it changes nothing. Resumed from its step 11
            // it runs step 12 again and saves it over the old one: die at one of that
            // save's points, then resume once more and compare.
            let before = std::fs::read(&log).unwrap();
            ok(&output(&args, &[], pid1));
            assert_eq!(std::fs::read(&log).unwrap(), before, "a resume of a finished run");
            let point = CRASH_POINTS[finished_resumes_killed % CRASH_POINTS.len()];
            let again = resume(base.clone(), &ckpt.join(format!("step-{:09}", STEPS - 1)));
            let out = output(&again, &[("WGTRAIN_TEST_CRASH_AT", &format!("{point}@{STEPS}"))], pid1);
            assert!(!out.status.success(), "re-save at {point}: {}", stderr(&out));
            aborts += 1;
            finished_resumes_killed += 1;
            ok(&output(&next_run(&base, &ckpt, &log), &[], pid1));
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
            let out = output(&args, &[("WGTRAIN_TEST_CRASH_AT", &at)], pid1);
            assert!(
                !out.status.success(),
                "abort at {at}: exit {:?}: {}",
                out.status.code(),
                stderr(&out)
            );
            aborts += 1;
        } else {
            // SIGKILL at a random moment of the run (start-up and saves included).
            let mut child = spawn_in(&args, &[], pid1);
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
    // Whatever state the kills left, resume works (as pid 1 too) and completes the run.
    ok(&output(&next_run(&base, &ckpt, &log), &[], true));
    check_and_start_over(&mut cycles);
    eprintln!(
        "kill loop: {} kills ({sigkills} SIGKILL at random moments, {aborts} aborts at save points, {finished_resumes_killed} of them in resumes of finished runs; {as_pid1} runs as pid 1 of a pid namespace), {missed} runs finished before their kill, {cycles} runs completed and equal to the uninterrupted one",
        sigkills + aborts
    );
}

/// The step of the folder's newest whole checkpoint.
fn saved_step(ckpt: &Path) -> Option<u64> {
    wgtrain_engine::train::checkpoint::resolve(ckpt).ok().and_then(|p| {
        wgtrain_engine::train::checkpoint::parse_step_dir(p.file_name()?.to_str()?.trim_start_matches('.').split(".old-").next()?)
    })
}

/// Every file of a folder and its bytes (to show a refused command touched nothing).
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name() != ".lock" {
                out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_resume_writes_only_into_its_own_folder_and_log() {
    let dir = scratch("resume-own");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let (log_a, log_b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
    // Two runs of one config: identical losses, so only the log's times tell them apart.
    run_ok(
        &with_log(
            small_args(b.to_str().unwrap(), &["--set", "train.steps=8", "--set", "checkpoint.every=2"]),
            &log_b,
        ),
        &[],
    );
    run_ok(
        &with_log(
            small_args(a.to_str().unwrap(), &["--set", "train.steps=4", "--set", "checkpoint.every=2"]),
            &log_a,
        ),
        &[],
    );
    let before_b = contents(&b);
    let before_log_b = std::fs::read(&log_b).unwrap();
    // Resuming A into B's folder: refused, B untouched.
    let out = run(
        &resume(with_log(small_args(b.to_str().unwrap(), &["--set", "train.steps=6"]), &log_a), &a),
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("not the folder --resume") && err.contains("steps 4, 6, 8"), "{err}");
    // Resuming A onto B's log: refused, naming it.
    let out = run(
        &resume(with_log(small_args(a.to_str().unwrap(), &["--set", "train.steps=6"]), &log_b), &a),
        &[],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("of another run"), "{}", stderr(&out));
    assert_eq!(contents(&b), before_b, "B's checkpoints untouched");
    assert_eq!(std::fs::read(&log_b).unwrap(), before_log_b, "B's log untouched");
    // A's own folder and log: resumed as before.
    run_ok(
        &resume(with_log(small_args(a.to_str().unwrap(), &["--set", "train.steps=6"]), &log_a), &a),
        &[],
    );
    assert_eq!(losses(&log_a).len(), 6);
    // Into an empty folder nothing is lost; --overwrite replaces another run's.
    let c = dir.join("c");
    run_ok(&resume(small_args(c.to_str().unwrap(), &["--set", "train.steps=7"]), &a), &[]);
    assert!(c.join("step-000000007/manifest.json").is_file());
    let mut args = resume(with_log(small_args(b.to_str().unwrap(), &["--set", "train.steps=7"]), &log_b), &a);
    args.push("--overwrite".into());
    run_ok(&args, &[]);
    assert!(b.join("step-000000007").is_dir() && !b.join("step-000000008").exists());
    assert_eq!(
        losses(&log_b).iter().map(|l| l.0).collect::<Vec<_>>(),
        vec![7],
        "B's log replaced by A's step"
    );
}

#[test]
fn an_edited_manifest_or_latest_cannot_steer_the_resume() {
    let dir = scratch("manifest");
    let ckpt = dir.join("ckpt");
    let c = ckpt.to_str().unwrap();
    run_ok(&small_args(c, &["--set", "train.steps=8", "--set", "checkpoint.every=4"]), &[]);
    let manifest = ckpt.join("step-000000008/manifest.json");
    let original = std::fs::read_to_string(&manifest).unwrap();
    for step in ["9", "0", "18446744073709551615"] {
        let edited = original.replacen("\"step\": 8", &format!("\"step\": {step}"), 1);
        assert_ne!(edited, original);
        std::fs::write(&manifest, edited).unwrap();
        let before = contents(&ckpt);
        let out = run(&resume(small_args(c, &["--set", "train.steps=12"]), &ckpt), &[]);
        assert!(!out.status.success(), "step {step}");
        assert!(stderr(&out).contains("disagrees"), "{}", stderr(&out));
        assert_eq!(contents(&ckpt), before, "step {step}: nothing written");
    }
    std::fs::write(&manifest, &original).unwrap();
    let outside = dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for target in ["../outside", outside.to_str().unwrap(), "step-000000004/../step-000000008"] {
        std::fs::write(ckpt.join("latest"), target).unwrap();
        let out = run(&resume(small_args(c, &["--set", "train.steps=12"]), &ckpt), &[]);
        assert!(!out.status.success(), "latest = {target}");
        assert!(stderr(&out).contains("not a step folder"), "{}", stderr(&out));
    }
    // A special file as `latest` is refused, not read forever.
    let _ = std::fs::remove_file(ckpt.join("latest"));
    std::os::unix::fs::symlink("/dev/zero", ckpt.join("latest")).unwrap();
    let out = run(&resume(small_args(c, &["--set", "train.steps=12"]), &ckpt), &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a regular file"), "{}", stderr(&out));
    std::fs::remove_file(ckpt.join("latest")).unwrap();
    std::fs::write(ckpt.join("latest"), "step-000000008").unwrap();
    run_ok(&resume(small_args(c, &["--set", "train.steps=10"]), &ckpt), &[]);
}

#[test]
fn a_signal_during_start_up_saves_nothing() {
    let dir = scratch("startup");
    // SIGTERM before the first step: no step-0 checkpoint that would block a fresh run.
    let fresh = dir.join("fresh");
    let child = spawn(&small_args(fresh.to_str().unwrap(), &["--set", "train.steps=100000"]), &[]);
    std::thread::sleep(Duration::from_millis(30));
    kill(child.id(), "TERM");
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let saved = std::fs::read_dir(&fresh).map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("step-")).count());
    assert_eq!(saved.unwrap_or(0), 0, "a run stopped before its first step saved a checkpoint");
    run_ok(&small_args(fresh.to_str().unwrap(), &["--set", "train.steps=1"]), &[]);
}

#[test]
fn a_full_disk_leaves_no_temporary_files() {
    let dir = scratch("fulldisk");
    let mnt = dir.join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let exe = env!("CARGO_BIN_EXE_wgtrain");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2/l1_h1_c16");
    // A 64 KiB tmpfs in a mount namespace of its own: the checkpoint (about 300 KB) and
    // the gradients cannot be written whole there.
    let args = small_args(mnt.join("ckpt").to_str().unwrap(), &["--set", "train.steps=1"]);
    let quoted = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let train: Vec<String> = args.iter().map(|a| quoted(a)).collect();
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs {m} || exit 90; \
         {exe} {train}; echo \"train $?\"; \
         head -c 1000000 /dev/zero > {m}/fill 2>/dev/null; \
         {exe} step --hf-dir {fx} --batch {fx}/batch.safetensors --dump-grads {m}/grads.safetensors; echo \"step $?\"; \
         rm -f {m}/fill; ls -A {m} {m}/ckpt",
        m = quoted(mnt.to_str().unwrap()),
        train = train.join(" "),
        fx = quoted(fixture.to_str().unwrap()),
    );
    let out = Command::new("unshare").args(["--mount", "sh", "-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(90), "could not mount a tmpfs: {err}");
    assert!(
        text.contains("train 1") && text.contains("step 1"),
        "both should fail: {text}\n{err}"
    );
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!text.contains(".tmp"), "temporary files left behind: {text}");
}

#[test]
fn resume_alone_takes_the_checkpoints_config_and_says_what_changes() {
    let dir = scratch("resume-alone");
    let ckpt = dir.join("ckpt");
    let (log, whole_log) = (dir.join("run.jsonl"), dir.join("whole.jsonl"));
    let base = small_args(
        ckpt.to_str().unwrap(),
        &["--set", "train.steps=3", "--set", "train.schedule=\"constant\""],
    );
    run_ok(&with_log(base.clone(), &log), &[]);
    // No config, no --set but the length: the checkpoint's config, and the length said.
    let args: Vec<String> = [
        "train",
        "--quiet",
        "--set",
        "train.steps=5",
        "--log",
        log.to_str().unwrap(),
        "--resume",
        ckpt.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let out = run(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("resuming with the config saved in") && said.contains("from 3 steps to 5 steps"),
        "{said}"
    );
    // The same as one run of five steps.
    let whole_dir = dir.join("whole");
    let whole = small_args(
        whole_dir.to_str().unwrap(),
        &["--set", "train.steps=5", "--set", "train.schedule=\"constant\""],
    );
    run_ok(&with_log(whole, &whole_log), &[]);
    assert_eq!(losses(&log), losses(&whole_log));
    // What makes the model or the batches cannot change.
    for set in ["model.hidden=[64]", "train.batch_size=32", "data.train_limit=128"] {
        let mut args = vec!["train".to_string(), "--quiet".into(), "--set".into(), set.into()];
        args.extend(["--resume".into(), ckpt.display().to_string()]);
        let out = run(&args, &[]);
        assert!(
            !out.status.success() && stderr(&out).contains("the checkpoint's model and batches are fixed"),
            "{set}: {}",
            stderr(&out)
        );
    }
    // A finished run says so.
    let args = vec!["train".to_string(), "--quiet".into(), "--resume".into(), ckpt.display().to_string()];
    let out = run(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("nothing to train: the run already finished its 5 steps"), "{said}");
    // And only that: no "5 steps in 0.0 s" as if it had trained them.
    assert!(!said.contains("steps in"), "{said}");
}
