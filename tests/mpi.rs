//! Training across processes over MPI (`parallel.backend = "mpi"`), with real `mpirun`
//! processes as root (as CI runs them), each rank a device of its own on lavapipe: every
//! step's loss equals the one-process run's over as many devices, bit for bit, for ZeRO
//! stages 0-3 and both offloads on two and three ranks (summing through the host's
//! shared-memory window, and through MPI's messages as between hosts), rank 0's log carrying every
//! rank's memory with its rank and machine; a two-rank checkpoint (each rank's shard of
//! the optimizer's state in a file of its own) resumes on three ranks and in one
//! process, and one with a shard missing or a manifest naming a stranger is refused; SIGTERM to one rank stops every rank after the same
//! step with one checkpoint and exit 143; SIGKILL of one rank ends the run non-zero
//! within 30 s, naming the lost rank; a log rank 0 cannot open ends the run at once, and
//! one it cannot write (a file-size limit) ends it after every rank has saved its shard
//! of the step; ranks given different runs are refused naming the first difference;
//! `estimate --ranks N`
//! equals rank 0's measured peak.

mod cli;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli::{char_gpt_sets, losses, run_ok, scratch};

/// One MPI job at a time: the tests' jobs, each of two or three ranks with their own
/// lavapipe devices, would otherwise share two cores five ways, and a rank's first step
/// (which compiles every kernel) could take minutes.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static JOBS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    JOBS.lock().unwrap_or_else(|e| e.into_inner())
}

/// `mpirun -n N` as CI runs it: as root, more ranks than cores, no shared-memory single
/// copy (refused in containers).
fn mpirun(n: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["-n", &n.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    cmd
}

/// The `train` arguments of the small character GPT (batch 12), with `sets` on top.
fn gpt(dir: &Path, sets: &[String]) -> Vec<String> {
    let mut args = vec!["train".to_string(), "--quiet".into()];
    for s in char_gpt_sets(dir).into_iter().chain(sets.iter().cloned()) {
        args.extend(["--set".into(), s]);
    }
    args
}

/// Runs `args` on `n` MPI ranks; returns the output (insisting on success).
fn mpi_ok(n: usize, args: &[String]) -> String {
    mpi_ok_env(n, args, true)
}

/// [`mpi_ok`], the ranks summing through the host's shared window or not.
fn mpi_ok_env(n: usize, args: &[String], shared_memory: bool) -> String {
    let out = mpirun(n)
        .env("WGTRAIN_MPI_SHARED_MEMORY", if shared_memory { "1" } else { "0" })
        .arg(env!("CARGO_BIN_EXE_wgtrain"))
        .args(args)
        .output()
        .expect("mpirun runs (the quick start installs openmpi-bin)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mpirun -n {n} wgtrain {args:?} failed:\n{text}");
    text
}

fn with_log(mut args: Vec<String>, log: &Path) -> Vec<String> {
    args.extend(["--log".into(), log.display().to_string()]);
    args
}

#[test]
fn every_zero_stage_and_offload_equals_the_one_process_run_bit_for_bit() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-equal");
    // The last field: whether the ranks sum through the host's shared window (else
    // through MPI's messages, as between hosts).
    for (ranks, zero, offload, shared) in [
        (2, 0, "none", true),
        (2, 0, "none", false),
        (2, 1, "none", true),
        (2, 2, "none", true),
        (2, 3, "none", true),
        (2, 1, "optimizer", true),
        (2, 3, "optimizer+parameters", true),
        (3, 2, "none", true),
        (3, 2, "none", false),
        (3, 3, "optimizer+parameters", true),
    ] {
        let name = format!(
            "n{ranks}z{zero}{}{}",
            offload.replace('+', "-"),
            if shared { "" } else { "-messages" }
        );
        let sets = [
            "train.steps=3".to_string(),
            format!("parallel.zero={zero}"),
            format!("parallel.offload=\"{offload}\""),
        ];
        let mut mpi = sets.to_vec();
        mpi.push("parallel.backend=\"mpi\"".into());
        let mpi_log = dir.join(format!("{name}.mpi.jsonl"));
        let text = mpi_ok_env(ranks, &with_log(gpt(&dir, &mpi), &mpi_log), shared);
        let how = if shared { "shared memory" } else { "MPI messages" };
        assert!(text.contains(&format!("on one host, summing through {how}")), "{name}:\n{text}");
        let mut one = sets.to_vec();
        one.push(format!("parallel.devices=[{}]", vec!["\"0\""; ranks].join(",")));
        // One process's run, once for both ways of summing.
        let one_log = dir.join(format!("n{ranks}z{zero}{}.jsonl", offload.replace('+', "-")));
        if !one_log.exists() {
            run_ok(&with_log(gpt(&dir, &one), &one_log), &[]);
        }
        let (a, b) = (losses(&mpi_log), losses(&one_log));
        assert_eq!(a.len(), 3, "{name}: three steps logged by rank 0 alone");
        assert_eq!(a, b, "{name}: MPI ranks against one process");
        // Rank 0's lines carry every rank's memory, each with its rank and machine.
        let text = std::fs::read_to_string(&mpi_log).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().rev().find(|l| l.contains("\"mem\"")).unwrap()).unwrap();
        let devices = last["mem"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), ranks, "{name}: one memory record per rank");
        for (r, d) in devices.iter().enumerate() {
            assert_eq!(d["rank"], r, "{name}");
            assert!(d["node"].as_str().is_some_and(|n| !n.is_empty()), "{name}: {d}");
            assert!(d["peak"].as_u64().unwrap() > 0, "{name}: {d}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// 8-bit AdamW over two MPI ranks at stage 2 equals the one-process run bit for bit;
/// each rank writes its shard of the state with its blocks' absmax, and the checkpoint
/// resumes in one process on two devices as that process's own run goes on.
#[test]
fn eight_bit_adamw_over_mpi_equals_one_process_and_its_shards_resume() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-8bit");
    let ckpt = dir.join("ckpt");
    let sets = |steps: u32, ckpt: &Path| {
        vec![
            "train.optimizer=\"adamw8bit\"".to_string(),
            format!("train.steps={steps}"),
            "parallel.zero=2".to_string(),
            format!("checkpoint.dir=\"{}\"", ckpt.display()),
        ]
    };
    let mut mpi = sets(3, &ckpt);
    mpi.push("parallel.backend=\"mpi\"".into());
    let mpi_log = dir.join("mpi.jsonl");
    mpi_ok(2, &with_log(gpt(&dir, &mpi), &mpi_log));
    let shard = ckpt.join("step-000000003/optimizer-00001-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(st.names().iter().any(|n| n.ends_with(".exp_avg.absmax")), "{:?}", st.names());
    let mut one = sets(5, &dir.join("one.ckpt"));
    one.push("parallel.devices=[\"0\",\"0\"]".into());
    let one_log = dir.join("one.jsonl");
    run_ok(&with_log(gpt(&dir, &one), &one_log), &[]);
    let full = losses(&one_log);
    assert_eq!(losses(&mpi_log), full[..3], "MPI ranks against one process");
    let mut resume = sets(5, &ckpt);
    resume.push("parallel.devices=[\"0\",\"0\"]".into());
    let mut args = with_log(gpt(&dir, &resume), &mpi_log);
    args.extend(["--resume".into(), ckpt.join("step-000000003").display().to_string()]);
    run_ok(&args, &[]);
    let resumed = losses(&mpi_log);
    assert_eq!(resumed.len(), 5);
    for ((s, a), (_, b)) in full.iter().zip(&resumed) {
        assert!(((a - b) / a).abs() <= 1e-4, "step {s}: {a} against {b}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_estimate_for_n_ranks_equals_rank_0s_measured_peak() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-estimate");
    for (ranks, zero, offload) in [(2, 3, "optimizer"), (3, 1, "none")] {
        let sets = vec![
            "train.steps=2".to_string(),
            format!("parallel.zero={zero}"),
            format!("parallel.offload=\"{offload}\""),
            "parallel.backend=\"mpi\"".into(),
        ];
        let log = dir.join(format!("n{ranks}z{zero}.jsonl"));
        mpi_ok(ranks, &with_log(gpt(&dir, &sets), &log));
        let measured = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|v| v["mem"]["devices"][0]["peak"].as_u64())
            .max()
            .unwrap();
        let mut args = vec!["estimate".to_string(), "--json".into(), "--ranks".into(), ranks.to_string()];
        for s in char_gpt_sets(&dir).into_iter().chain(sets) {
            args.extend(["--set".into(), s]);
        }
        let est: serde_json::Value = serde_json::from_str(&run_ok(&args, &[])).unwrap();
        assert_eq!(est["peak_bytes"].as_u64(), Some(measured), "{ranks} ranks, zero {zero}: {est}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_two_rank_checkpoint_resumes_on_three_ranks_and_in_one_process() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-resume");
    let ckpt = dir.join("ckpt");
    let sets = |steps: u32| {
        vec![
            format!("train.steps={steps}"),
            "parallel.zero=2".to_string(),
            format!("checkpoint.dir=\"{}\"", ckpt.display()),
        ]
    };
    let log = dir.join("run.jsonl");
    let mut two = sets(3);
    two.push("parallel.backend=\"mpi\"".into());
    mpi_ok(2, &with_log(gpt(&dir, &two), &log));
    // Each rank wrote its own shard of the optimizer's state; no file holds it whole.
    let files = |step: u32| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(ckpt.join(format!("step-{step:09}")))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        files(3),
        [
            "manifest.json",
            "model.safetensors",
            "optimizer-00000-of-00002.safetensors",
            "optimizer-00001-of-00002.safetensors",
            "trainer.safetensors"
        ]
    );
    // A missing shard, or a manifest naming a file no checkpoint has, is refused by name.
    let step3 = ckpt.join("step-000000003");
    let copy = dir.join("copy");
    std::fs::create_dir_all(copy.join("step-000000003")).unwrap();
    for f in files(3) {
        std::fs::copy(step3.join(&f), copy.join("step-000000003").join(&f)).unwrap();
    }
    let resume_copy = |what: &str| {
        let one = [
            "train.steps=4".to_string(),
            "parallel.zero=0".into(),
            "parallel.backend=\"in-process\"".into(),
            format!("checkpoint.dir=\"{}\"", copy.display()),
        ];
        let mut args = gpt(&dir, &one);
        args.extend(["--resume".into(), copy.display().to_string()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cli::wgtrain(&refs, &[]);
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{what}: resumed");
        text
    };
    std::fs::remove_file(copy.join("step-000000003/optimizer-00001-of-00002.safetensors")).unwrap();
    let text = resume_copy("a shard missing");
    assert!(text.contains("optimizer-00001-of-00002.safetensors"), "{text}");
    let manifest = copy.join("step-000000003/manifest.json");
    let edited = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("optimizer-00001-of-00002.safetensors", "../../outside.safetensors");
    std::fs::write(&manifest, edited).unwrap();
    let text = resume_copy("a manifest naming another file");
    assert!(
        text.contains("'../../outside.safetensors', which is no file of a checkpoint"),
        "{text}"
    );
    let mut three = sets(5);
    three.push("parallel.backend=\"mpi\"".into());
    let mut args = with_log(gpt(&dir, &three), &log);
    args.extend(["--resume".into(), ckpt.display().to_string()]);
    mpi_ok(3, &args);
    let steps: Vec<u64> = losses(&log).iter().map(|s| s.0).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5], "one log, continued by rank 0 of the three");
    assert!(
        files(5).contains(&"optimizer-00002-of-00003.safetensors".to_string()),
        "{:?}",
        files(5)
    );
    // The same folder, on to step 7 in one process (stage 0, one device).
    let mut one = sets(7);
    one[1] = "parallel.zero=0".into();
    let mut args = with_log(gpt(&dir, &one), &log);
    args.extend(["--resume".into(), ckpt.display().to_string()]);
    run_ok(&args, &[]);
    let all = losses(&log);
    assert_eq!(all.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6, 7]);
    assert!(all.iter().all(|s| s.1.is_finite() && s.1 < all[0].1 + 0.5), "{all:?}");
    assert!(
        files(7).contains(&"optimizer.safetensors".to_string()),
        "one process writes the state whole"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pids of the `wgtrain` processes `mpirun` (pid `parent`) started.
fn ranks_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let after = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
        let ppid: u32 = after.split(' ').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == parent && stat.contains("(wgtrain)") {
            out.push(pid);
        }
    }
    out.sort();
    out
}

/// Starts a long run on `n` ranks logging to `log`; returns mpirun and the ranks' pids
/// once rank 0 has logged `after` steps.
fn start_long(dir: &Path, n: usize, log: &Path, extra: &[String], after: usize) -> (std::process::Child, Vec<u32>) {
    let mut sets = vec![
        "train.steps=100000".to_string(),
        "parallel.zero=1".into(),
        "parallel.backend=\"mpi\"".into(),
    ];
    sets.extend(extra.iter().cloned());
    let child = spawn_piped(&mut mpirun(n).arg(env!("CARGO_BIN_EXE_wgtrain")).args(with_log(gpt(dir, &sets), log)));
    let start = Instant::now();
    loop {
        let done = std::fs::read_to_string(log)
            .map(|t| t.lines().filter(|l| l.contains("\"loss\"")).count())
            .unwrap_or(0);
        let pids = ranks_of(child.id());
        if done >= after && pids.len() == n {
            return (child, pids);
        }
        assert!(start.elapsed() < Duration::from_secs(240), "the run did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for `child` at most `limit`; returns its exit code and output.
fn wait_for(mut child: std::process::Child, limit: Duration) -> (Option<i32>, String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            return (status.code(), text, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("mpirun still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `cmd` with its output piped (read by [`wait_for`]).
fn spawn_piped(cmd: &mut Command) -> std::process::Child {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

#[test]
fn sigterm_to_one_rank_saves_once_and_every_rank_exits_143() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-sigterm");
    let ckpt: PathBuf = dir.join("ckpt");
    let log = dir.join("run.jsonl");
    let extra = [format!("checkpoint.dir=\"{}\"", ckpt.display())];
    let (child, pids) = start_long(&dir, 2, &log, &extra, 3);
    // The signal goes to rank 1 only, as Slurm's to one task would.
    let status = Command::new("kill").args(["-TERM", &pids[1].to_string()]).status().unwrap();
    assert!(status.success());
    let (code, text, _) = wait_for(child, Duration::from_secs(60));
    assert_eq!(code, Some(143), "{text}");
    assert_eq!(text.matches("interrupted by SIGTERM").count(), 2, "both ranks exit on it:\n{text}");
    let last = losses(&log).last().unwrap().0;
    let saved: Vec<String> = std::fs::read_dir(&ckpt)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert_eq!(saved, [format!("step-{last:09}")], "one checkpoint, of the last logged step");
    assert!(
        text.contains(&format!("--resume {}", ckpt.join(format!("step-{last:09}")).display())),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_rank_ends_the_run_within_30_seconds_naming_it() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-sigkill");
    let log = dir.join("run.jsonl");
    let (child, pids) = start_long(&dir, 3, &log, &[], 2);
    let status = Command::new("kill").args(["-KILL", &pids[2].to_string()]).status().unwrap();
    assert!(status.success());
    let (code, text, took) = wait_for(child, Duration::from_secs(30));
    assert_ne!(code, Some(0), "{text}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(
        text.contains("noticed that process rank") && text.contains("exited on signal 9"),
        "the lost rank is named:\n{text}"
    );
    // No rank is left running: the others end within seconds of mpirun (one may stay a
    // zombie until it is reaped; a pid taken again by another program is not a rank).
    let running = |pid: &u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.contains("(wgtrain)") && !stat.rsplit_once(") ").is_some_and(|x| x.1.starts_with('Z'))
    };
    let start = Instant::now();
    while pids.iter().any(running) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<_> = pids.iter().filter(|p| running(p)).collect();
    assert!(left.is_empty(), "ranks still running 20 s after mpirun ended: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_log_rank_0_cannot_write_saves_every_ranks_shard_and_ends_the_run() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-log-full");
    let ckpt = dir.join("ckpt");
    let log = dir.join("run.jsonl");
    let sets = [
        "model.n_layer=1".to_string(),
        "model.n_embd=16".into(),
        "train.steps=100000".into(),
        "parallel.zero=1".into(),
        "parallel.backend=\"mpi\"".into(),
        format!("checkpoint.dir=\"{}\"", ckpt.display()),
    ];
    let mut args = with_log(gpt(&dir, &sets), &log);
    args.push("--no-record".into());
    // Each rank may write files of 32 KiB at most (a full disk or quota, for its log
    // only: the checkpoint's files are smaller). MPI's shared-memory transports, whose
    // segments are files too, are left out.
    let child = spawn_piped(
        &mut mpirun(2)
            .args(["--mca", "btl", "tcp,self"])
            .env("WGTRAIN_MPI_SHARED_MEMORY", "0")
            .args(["sh", "-c", "trap '' XFSZ; ulimit -f 64; exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_wgtrain"))
            .args(&args),
    );
    // It used to hang here: rank 0 saved alone, its exchanges met the other rank's
    // next step, and ending the run waited for a communicator the others never made.
    let (code, text, _) = wait_for(child, Duration::from_secs(120));
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("rank 0 of 2 failed: writing the log") && text.contains("File too large"),
        "{text}"
    );
    let saved: Vec<String> = std::fs::read_dir(&ckpt)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert_eq!(saved.len(), 1, "one checkpoint, saved on the error: {saved:?}\n{text}");
    let step: u64 = saved[0]["step-".len()..].parse().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    let last = logged
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .max();
    assert!(last.is_some_and(|l| l + 1 >= step), "saved step {step}, last logged {last:?}");
    // Both ranks' shards are in it: it resumes (every file's hash checked) in one process.
    let mut one = sets.to_vec();
    one[2] = format!("train.steps={}", step + 1);
    one[3] = "parallel.zero=0".into();
    one[4] = "parallel.backend=\"in-process\"".into();
    let mut resumed = gpt(&dir, &one);
    resumed.extend(["--resume".into(), ckpt.display().to_string()]);
    run_ok(&resumed, &[]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_0_error_before_the_first_step_ends_every_rank_at_once() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-bad-log");
    let sets = ["parallel.backend=\"mpi\"".to_string()];
    let args = with_log(gpt(&dir, &sets), Path::new("/dev/full"));
    let child = spawn_piped(&mut mpirun(2).arg(env!("CARGO_BIN_EXE_wgtrain")).args(&args));
    // Only rank 0 opens the log. Ending the run used to duplicate MPI_COMM_WORLD (a
    // collective) while rank 1 waited in its first exchange: both waited for ever.
    let (code, text, took) = wait_for(child, Duration::from_secs(60));
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("rank 0 of 2 failed: log: /dev/full is a device"), "{text}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_of_different_runs_are_refused_naming_the_difference() {
    let _one = one_at_a_time();
    let dir = scratch("mpi-differ");
    let sets = ["parallel.backend=\"mpi\"".to_string(), "train.steps=2".into()];
    let mut other = sets.to_vec();
    other.push("model.n_embd=48".into());
    let bin = env!("CARGO_BIN_EXE_wgtrain");
    // One command line per rank (MPMD): rank 1's model is wider. Their exchanges would
    // not match: it used to fail inside the first one, naming a shared segment.
    let child = spawn_piped(
        &mut mpirun(1)
            .arg(bin)
            .args(gpt(&dir, &sets))
            .args([":", "-n", "1", bin])
            .args(gpt(&dir, &other)),
    );
    let (code, text, _) = wait_for(child, Duration::from_secs(60));
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("rank 1 does not run rank 0's run: config.model.n_embd is 48 there, 40 on rank 0"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
