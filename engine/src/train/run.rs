//! The training loop: resume, then for each step take the next batch, set the learning
//! rate, run the out-of-memory-resilient step (every `profile_every` steps with its
//! launches timed), end the allocator's step (guard bytes),
//! and tell the observers (the JSONL log, the progress bar, the dashboard) the step's
//! line and memory; evaluate and checkpoint on schedule; save a last checkpoint.
//!
//! May call: `data`, `error`, `optim`, `wgtrain_record`, `train::{checkpoint, error,
//! log, observe, profile, progress, state, step, eval, trainer}`. Called by: the CLI, tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;
use wgtrain_record::{EvalLog, RunInfo, StepLog, StepMemory};

use crate::data::batches_per_epoch;
use crate::error::Error;
use crate::optim::lr_at;
use crate::train::checkpoint;
use crate::train::checkpoint::dir::{CheckpointDir, Start};
use crate::train::error::TrainError;
use crate::train::observe::Observer;
use crate::train::observe::log::{LogWriter, repair_log};
use crate::train::observe::profile::kernel_rows;
use crate::train::observe::progress::ProgressBar;
use crate::train::trainer::{StepKind, Trainer};

/// How to run besides the config.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Where to write the JSONL log.
    pub log: Option<PathBuf>,
    /// Checkpoint to resume from.
    pub resume: Option<PathBuf>,
    /// Delete the checkpoints already in `checkpoint.dir` and replace the log where they
    /// are another run's: a fresh run into a folder that holds checkpoints or onto a log
    /// that holds a run, or a resume whose `checkpoint.dir` is not the folder it resumes
    /// from or whose log is another run's, is refused otherwise.
    pub overwrite: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Set to stop after the current step (Ctrl-C); a checkpoint is saved if configured.
    pub stop: Option<Arc<AtomicBool>>,
    /// Told about every step with its memory timeline (the dashboard).
    pub observer: Option<Arc<dyn Observer>>,
    /// Profile every this many steps (0: never): the step's line carries its kernel
    /// table and GPU busy time (needs GPU timestamps).
    pub profile_every: u64,
}

/// What a finished run reports.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    /// Steps done in total (including those before a resume).
    pub steps: u64,
    /// Loss of each step run in this invocation, in order.
    pub losses: Vec<f64>,
    /// The last evaluation.
    pub last_eval: Option<EvalLog>,
    /// Wall time of this invocation.
    pub seconds: f64,
    /// Whether the run stopped early on request.
    pub interrupted: bool,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
}

impl Trainer {
    /// Runs to the configured end (or until asked to stop).
    pub fn run(&mut self, options: &RunOptions) -> Result<RunSummary, TrainError> {
        // Settings that need the data's length, checked before any file is touched.
        let total = self.total_steps();
        // Allowed (a short trial of a long run's config), but said.
        if self.config.train.warmup_steps > total {
            tracing::warn!(
                "train.warmup_steps {} is more than the run's {total} steps: the learning rate never reaches train.lr",
                self.config.train.warmup_steps
            );
        }
        // The log is a regular file or nothing yet (a folder, a device or a FIFO would be
        // read forever, block, or never hold the lines).
        if let Some(path) = &options.log
            && let Ok(meta) = std::fs::metadata(path)
            && !meta.is_file()
        {
            return Err(TrainError::Engine(Error::invalid(
                "log",
                format!("{} is {}, not a file: give a file path", path.display(), crate::files::kind(&meta)),
            )));
        }
        // A fresh run never appends to another run's log: refused, or replaced on request.
        if let (Some(path), None) = (&options.log, &options.resume)
            && std::fs::metadata(path).is_ok_and(|m| m.len() > 0)
        {
            if !options.overwrite {
                return Err(TrainError::Engine(Error::invalid(
                    "log",
                    format!(
                        "{} already holds a run: give another --log, continue that run with --resume, or replace it with --overwrite",
                        path.display()
                    ),
                )));
            }
            std::fs::remove_file(path).map_err(|e| TrainError::Log {
                path: path.display().to_string(),
                source: e,
            })?;
        }
        // The folder is checked, mended and locked before anything is trained. A resume
        // writes into the folder it resumes from; another folder is met as a fresh run
        // meets it (its checkpoints are another run's).
        // Over MPI rank 0 alone holds the folder (and writes the log); the others only
        // take part in each save's exchanges.
        let held = match &self.config.checkpoint.dir {
            Some(dir) if self.writes() => {
                let own = options
                    .resume
                    .as_deref()
                    .is_some_and(|r| same_folder(&resume_root(r), Path::new(dir)));
                let start = match (own, options.overwrite) {
                    (true, _) => Start::Resume,
                    (false, true) => Start::Overwrite,
                    (false, false) => Start::Fresh,
                };
                Some(CheckpointDir::open(Path::new(dir), start).map_err(|e| match (&options.resume, e) {
                    (Some(r), checkpoint::CheckpointError::Unusable { path, reason }) if !own => checkpoint::CheckpointError::Unusable {
                        path,
                        reason: format!("it is not the folder --resume {} continues from, and {reason}", r.display()),
                    },
                    (_, e) => e,
                })?)
            }
            _ => None,
        };
        if let Some(path) = &options.resume {
            self.restore(path)?;
            if let Some(log) = &options.log {
                check_resumed_log(log, self.log_first, options.overwrite)?;
            }
        }
        let start_step = self.step;
        let started = Instant::now();

        let mut observers: Vec<Arc<dyn Observer>> = Vec::new();
        if let Some(path) = &options.log {
            let resumed = options.resume.as_ref().map(|_| self.step);
            let dropped = repair_log(path, resumed)?;
            if dropped > 0 {
                tracing::warn!(
                    "{}: dropped {dropped} line(s) after step {} or cut short",
                    path.display(),
                    self.step
                );
            }
            observers.push(Arc::new(LogWriter::open(path)?));
            // The log is known by its first step line, once it has one.
            self.log_first = Some(
                crate::train::observe::log::scan_log(path)
                    .map_err(|e| TrainError::Log {
                        path: path.display().to_string(),
                        source: e,
                    })?
                    .1,
            );
        } else if options.resume.is_none() {
            // A fresh run without a log; a resumed one keeps the log its run started.
            self.log_first = Some(None);
        }
        if let Some(o) = &options.observer {
            observers.push(o.clone());
        }
        if options.progress {
            observers.push(Arc::new(ProgressBar::new(total, self.step)));
        }
        let wants_memory = observers.iter().any(|o| o.wants_memory());
        let mut loader = self.batches();
        if options.profile_every > 0 && !self.rt.has_timestamps() {
            return Err(TrainError::Engine(Error::invalid(
                "profile_every",
                format!(
                    "the adapter '{}' grants no GPU timestamps (TIMESTAMP_QUERY), so steps cannot be profiled",
                    self.rt.gpu.report.name
                ),
            )));
        }
        let info = RunInfo {
            device: self.rt.gpu.report.clone(),
            config: serde_json::to_value(&self.config).unwrap_or_default(),
            parameters: self.parameter_count() as u64,
            total_steps: total,
            notes: self.notes.clone(),
            cap: self.rt.alloc.stats().cap,
            whatif: if wants_memory { self.what_if() } else { Vec::new() },
        };
        for o in &observers {
            o.start(&info)?;
        }
        if wants_memory {
            // The first step's timeline starts from an empty trace.
            self.rt.alloc.take_events();
        }
        let ckpt_dir = match &held {
            Some(h) => Some(h.root().to_path_buf()),
            None if !self.writes() => self.config.checkpoint.dir.as_ref().map(PathBuf::from),
            None => None,
        };
        let mut summary = RunSummary {
            steps: self.step,
            losses: Vec::new(),
            last_eval: None,
            seconds: 0.0,
            interrupted: false,
            checkpoint: None,
        };
        let mut saved_at = start_step;
        let looped = self.train_loop(options, &observers, &mut loader, &mut summary, ckpt_dir.as_deref(), &mut saved_at);
        drop(loader);
        // An error between steps (a data file changed, the log could not be written)
        // leaves the state of the last finished step: it is saved before the error is
        // reported, so no finished step is lost; over MPI the other ranks stopped after
        // the same step and save it with this one. (An error inside a step may leave
        // the weights half updated: nothing is saved then.)
        if let (Err(_), Some(dir)) = (&looped, &ckpt_dir)
            && self.consistent
            && self.step > saved_at
        {
            match self.save(dir) {
                Ok(p) => tracing::warn!("saved {} before stopping on the error", p.display()),
                Err(save) => tracing::error!("could not save a checkpoint after the error: {save}"),
            }
        }
        looped?;
        // A last checkpoint of the steps this invocation did (none when it did none:
        // a run stopped during start-up leaves nothing that would block a fresh run).
        if let Some(dir) = &ckpt_dir
            && self.step > saved_at
        {
            summary.checkpoint = Some(self.save(dir)?);
        }
        summary.steps = self.step;
        summary.seconds = started.elapsed().as_secs_f64();
        for o in &observers {
            o.finish();
        }
        Ok(summary)
    }

    /// The steps, evaluations and scheduled checkpoints of [`Trainer::run`]; `saved_at`
    /// follows the last checkpoint's step. On-device steps overlap: step N+1 is
    /// recorded while step N runs and N is read back after (`Trainer::record_step`), so
    /// the device does not wait for the host between them; a step after which
    /// something reads the weights (an evaluation, a checkpoint, the end) is read back
    /// before that. An error between steps reads back the step in flight first, so its
    /// line is logged and the checkpoint saved on the error holds it.
    fn train_loop(
        &mut self,
        options: &RunOptions,
        observers: &[Arc<dyn Observer>],
        loader: &mut crate::data::loader::Loader,
        summary: &mut RunSummary,
        ckpt_dir: Option<&Path>,
        saved_at: &mut u64,
    ) -> Result<(), TrainError> {
        let mut lines = Lines {
            observers,
            has_log: options.log.is_some(),
            wants_memory: observers.iter().any(|o| o.wants_memory()),
            flops_per_example: self.model_flops_per_example(),
            tokens_per_example: self.tokens_per_example(),
            peak: self.known_peak_tflops(),
            last_end: None,
            held: None,
        };
        let mut flight = None;
        let looped = self.steps(options, &mut lines, &mut flight, loader, summary, ckpt_dir, saved_at);
        let looped = match (looped, flight) {
            (Ok(()), Some(f)) => self.land(f, &mut lines, summary).map(|_| ()),
            (Err(e), Some(f)) => {
                if self.land(f, &mut lines, summary).is_err() {
                    self.consistent = false;
                }
                Err(e)
            }
            (looped, None) => looped,
        };
        looped.and_then(|()| lines.held.take().map_or(Ok(()), Err))
    }

    /// [`Trainer::train_loop`]'s steps; `flight` holds the step recorded and not yet
    /// read back.
    #[allow(clippy::too_many_arguments)]
    fn steps(
        &mut self,
        options: &RunOptions,
        lines: &mut Lines<'_>,
        flight: &mut Option<Flight>,
        loader: &mut crate::data::loader::Loader,
        summary: &mut RunSummary,
        ckpt_dir: Option<&Path>,
        saved_at: &mut u64,
    ) -> Result<(), TrainError> {
        let t = self.config.train.clone();
        let total = self.total_steps();
        while self.step < total {
            // Over MPI every rank stops at the same step when any was asked to, or holds
            // an error from between steps (then every rank saves this step together).
            let asked = options.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst));
            if self.stop_agreed(asked || lines.held.is_some())? {
                if let Some(e) = lines.held.take() {
                    return Err(e);
                }
                summary.interrupted = true;
                break;
            }
            let Some(batch) = loader.next_batch() else { break };
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    lines.held.get_or_insert(e.into());
                    continue;
                }
            };
            let lr = lr_at(
                self.step,
                t.lr,
                t.warmup_steps,
                total,
                t.min_lr,
                t.schedule == crate::train::config::Schedule::Cosine,
            );
            let profiled = options.profile_every > 0 && (self.step + 1).is_multiple_of(options.profile_every);
            let overlaps = self.step_kind == StepKind::OnDevice && !profiled;
            if !overlaps && let Some(f) = flight.take() {
                self.land(f, lines, summary)?;
            }
            let mut next = self.launch(batch, lr, profiled, overlaps, lines.wants_memory)?;
            if let Some(f) = flight.take()
                && self.land(f, lines, summary)?
            {
                // The step before was skipped (fp16-mixed), so this one, recorded with
                // the scale before the backoff, was skipped on the device too: again.
                next = self.relaunch(next, lines.wants_memory)?;
            }
            let epoch_end = self.index == 0;
            let eval_now = if t.eval_every > 0 {
                self.step.is_multiple_of(t.eval_every)
            } else {
                epoch_end
            } || self.step == total;
            let save_now = ckpt_dir.is_some() && self.config.checkpoint.every > 0 && self.step.is_multiple_of(self.config.checkpoint.every);
            if overlaps && !eval_now && !save_now && self.step < total {
                *flight = Some(next);
                continue;
            }
            let epoch = next.batch.position.0;
            // Skipped or not, nothing was recorded after it: no step to record again.
            self.land(next, lines, summary)?;
            if eval_now {
                // The evaluation's own peak, measured alone; the run's peaks kept.
                let before = self.rt.alloc.stats();
                self.rt.alloc.reset_peaks();
                let mut e = self.evaluate()?;
                let after = self.rt.alloc.stats();
                e.peak = Some(after.allocated.peak);
                e.reserved = Some(after.reserved.current);
                self.rt.alloc.keep_peaks(&before);
                let line = StepLog {
                    step: self.step,
                    epoch,
                    time: Some(unix_seconds()),
                    eval: Some(e.clone()),
                    ..Default::default()
                };
                lines.tell(|o| o.eval(&line));
                if lines.wants_memory {
                    // Evaluation's allocations are not part of the next step's timeline.
                    self.rt.alloc.take_events();
                }
                summary.last_eval = Some(e);
            }
            if let Some(dir) = ckpt_dir
                && save_now
            {
                summary.checkpoint = Some(self.save(dir)?);
                *saved_at = self.step;
            }
        }
        Ok(())
    }

    /// Records step `self.step + 1` on `batch` (out-of-memory resilient): with
    /// `overlaps`, without waiting for it (`Trainer::record_step`), else the whole step;
    /// `profiled` times its every launch. Ends the allocator's step and moves the
    /// position on; the step's line is written when it lands ([`Trainer::land`]).
    fn launch(
        &mut self,
        batch: crate::data::HostBatch,
        lr: f32,
        profiled: bool,
        overlaps: bool,
        wants_memory: bool,
    ) -> Result<Flight, TrainError> {
        for rt in self.runtimes() {
            rt.alloc.reset_peaks();
        }
        let start_us = self.rt.alloc.now_us();
        let start = Instant::now();
        let scale = self.scaler.as_ref().map(|s| s.scale as f64);
        if profiled {
            self.rt.sync()?;
            self.rt.start_profiling()?;
        }
        let metered = !profiled && self.config.train.log_gpu_busy && self.rt.start_meter();
        self.consistent = false;
        let before = (self.step, self.epoch, self.index);
        let (state, event) = if overlaps {
            let (pending, event) = self.resilient(&batch, lr, Trainer::record_step)?;
            (Landing::Pending(pending), event)
        } else {
            let ((loss, skipped), event) = self.resilient(&batch, lr, Trainer::train_step)?;
            (Landing::Done(loss, skipped), event)
        };
        let kernels = if profiled {
            self.rt.sync()?;
            let trace = self.rt.collect_profile();
            self.rt.stop_profiling();
            Some(kernel_rows([trace?.launches.as_slice()]))
        } else {
            None
        };
        let busy = match (metered, overlaps) {
            (false, _) => Busy::Unmetered,
            (true, true) => self.rt.end_meter()?.map_or(Busy::Unmetered, Busy::Ticket),
            (true, false) => Busy::Seconds(self.rt.take_meter()?),
        };
        let mut guard = self.rt.alloc.end_step();
        for rt in &self.runtimes()[1..] {
            guard = guard.and(rt.alloc.end_step());
        }
        guard.map_err(Error::from)?;
        self.step += 1;
        let per_epoch = batches_per_epoch(self.train.len(), self.config.train.batch_size, false);
        (self.epoch, self.index) = if batch.position.1 + 1 >= per_epoch {
            (batch.position.0 + 1, 0)
        } else {
            (batch.position.0, batch.position.1 + 1)
        };
        self.consistent = true;
        let mem = self.step_memory()?;
        let memory = wants_memory.then(|| {
            let end_us = self.rt.alloc.now_us();
            let (events, dropped) = self.rt.alloc.take_events();
            let pages = self.rt.alloc.snapshot_pages();
            StepMemory::from_events(self.step, start_us, end_us, &events, dropped, pages)
        });
        Ok(Flight {
            micro_batch: self.config.train.micro_batch_size.filter(|&m| m < batch.examples),
            batch,
            lr,
            before,
            step: self.step,
            state,
            event,
            start,
            scale,
            busy,
            kernels,
            mem,
            memory,
        })
    }

    /// Records a step again after the step before it was skipped (see
    /// [`Trainer::train_loop`]): from where it started, with the scale backed off.
    fn relaunch(&mut self, f: Flight, wants_memory: bool) -> Result<Flight, TrainError> {
        let Flight {
            batch, lr, before, state, ..
        } = f;
        // Its read-back is dropped unread (the device skipped its update).
        drop(state);
        (self.step, self.epoch, self.index) = before;
        self.launch(batch, lr, false, true, wants_memory)
    }

    /// Reads a recorded step back and tells the observers its line; returns whether it
    /// was skipped (fp16-mixed: a step recorded after it has to be recorded again).
    fn land(&mut self, f: Flight, lines: &mut Lines<'_>, summary: &mut RunSummary) -> Result<bool, TrainError> {
        let (loss, skipped) = match f.state {
            Landing::Pending(p) => {
                let finished = self.finish_step(p);
                if finished.is_err() {
                    // A non-finite f32 loss: the steps recorded since were skipped on the
                    // device, so the position is ahead of the weights: nothing is saved.
                    self.consistent = false;
                }
                finished?
            }
            Landing::Done(loss, skipped) => (loss, skipped),
        };
        let busy_s = match f.busy {
            Busy::Unmetered => None,
            Busy::Ticket(ticket) => self.rt.read_meter(ticket)?,
            Busy::Seconds(s) => s,
        };
        // A step's time runs from its start, or from the step before's end where it
        // was recorded while that one ran: consecutive lines add up to the run's time.
        let end = Instant::now();
        let from = match lines.last_end {
            Some(last) if last > f.start => last,
            _ => f.start,
        };
        lines.last_end = Some(end);
        let step_s = end.duration_since(from).as_secs_f64();
        let now = unix_seconds();
        if lines.has_log && self.log_first == Some(None) {
            self.log_first = Some(Some((f.step, now, loss)));
        }
        summary.losses.push(loss);
        let samples_per_s = f.batch.examples as f64 / step_s;
        let model_tflops = lines.flops_per_example * samples_per_s / 1e12;
        let line = StepLog {
            step: f.step,
            epoch: f.batch.position.0,
            time: Some(now),
            loss: Some(loss),
            lr: Some(f.lr as f64),
            step_ms: Some(step_s * 1e3),
            samples_per_s: Some(samples_per_s),
            tokens_per_s: lines.tokens_per_example.map(|t| t as f64 * samples_per_s),
            model_tflops: Some(model_tflops),
            mfu: lines.peak.map(|p| model_tflops / p),
            mem: Some(f.mem),
            gpu_ms: f.kernels.as_ref().map(|(_, ns)| ns * 1e-6).or(busy_s.map(|s| s * 1e3)),
            kernels: f.kernels.map(|(rows, _)| rows),
            scale: f.scale,
            skipped: self.scaler.as_ref().map(|_| skipped),
            micro_batch: f.micro_batch,
            grad_norm: self.grad_norm.take(),
            update_ratio: self.update_ratio.take(),
            host_rss: resident_bytes(),
            event: f.event,
            eval: None,
        };
        lines.tell(|o| o.step(&line, f.memory.as_ref()));
        Ok(skipped)
    }
}

/// What the step lines of a run share: who is told, and the figures they derive from.
struct Lines<'a> {
    observers: &'a [Arc<dyn Observer>],
    /// Whether the run writes a log (known by its first line).
    has_log: bool,
    wants_memory: bool,
    flops_per_example: f64,
    tokens_per_example: Option<usize>,
    peak: Option<f64>,
    /// When the last step landed.
    last_end: Option<Instant>,
    /// The first error an observer gave (a log that cannot be written), held until the
    /// step ends: every rank then stops after it and saves it (`Trainer::steps`).
    held: Option<TrainError>,
}

impl Lines<'_> {
    /// Tells every observer; the first failure is held (see `held`).
    fn tell(&mut self, f: impl Fn(&dyn Observer) -> Result<(), TrainError>) {
        for o in self.observers {
            if let Err(e) = f(&**o) {
                self.held.get_or_insert(e);
            }
        }
    }
}

/// A recorded step on its way to its line ([`Trainer::land`]).
struct Flight {
    batch: crate::data::HostBatch,
    lr: f32,
    /// Step, epoch and index before it.
    before: (u64, u64, u64),
    /// Its number.
    step: u64,
    state: Landing,
    event: Option<String>,
    start: Instant,
    scale: Option<f64>,
    busy: Busy,
    kernels: Option<(Vec<wgtrain_record::KernelRow>, f64)>,
    mem: wgtrain_record::MemLog,
    memory: Option<StepMemory>,
    micro_batch: Option<usize>,
}

/// A recorded step's loss and skip: still on the device, or read.
enum Landing {
    Pending(crate::train::step::PendingStep),
    Done(f64, bool),
}

/// A step's GPU busy time: not metered, metered and ended (read when it lands), or read.
enum Busy {
    Unmetered,
    Ticket(u64),
    Seconds(Option<f64>),
}

/// The checkpoint folder a `--resume` path belongs to: the path itself, or the parent
/// of a step folder (one holding manifest.json).
fn resume_root(path: &Path) -> PathBuf {
    if path.join("manifest.json").is_file() {
        path.parent().map_or_else(|| path.to_path_buf(), Path::to_path_buf)
    } else {
        path.to_path_buf()
    }
}

/// Whether two paths name one folder (both exist and resolve alike).
fn same_folder(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A resumed run appends to `log` only if the log is the run's own: empty or missing,
/// or starting with the step line the checkpoint names (`first`: `Some(None)` for a run
/// that kept no log; `None`, a checkpoint written before logs were named, is not
/// checked). Another run's log is refused, naming what would be lost, unless
/// `overwrite` (then it is replaced).
fn check_resumed_log(log: &Path, first: Option<Option<crate::train::trainer::LogLine>>, overwrite: bool) -> Result<(), TrainError> {
    let err = |e| TrainError::Log {
        path: log.display().to_string(),
        source: e,
    };
    let Ok(meta) = std::fs::metadata(log) else { return Ok(()) };
    if !meta.is_file() {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file ({})", crate::files::kind(&meta)),
        )));
    }
    let Some(want) = first else { return Ok(()) };
    if meta.len() == 0 {
        return Ok(());
    }
    let (lines, found) = crate::train::observe::log::scan_log(log).map_err(err)?;
    // Within 4 units in the last place: JSON's number parser may round a value it
    // wrote one place off.
    let near = |a: f64, b: f64| a.is_sign_negative() == b.is_sign_negative() && a.to_bits().abs_diff(b.to_bits()) <= 4;
    let same = match (found, want) {
        (None, _) => true, // no step line yet: nothing of a run to lose
        (Some((s, t, l)), Some((ws, wt, wl))) => s == ws && near(t, wt) && near(l, wl),
        (Some(_), None) => false,
    };
    if same {
        return Ok(());
    }
    if overwrite {
        return std::fs::remove_file(log).map_err(err);
    }
    let seen = match (found, want) {
        (Some((s, t, _)), Some((ws, wt, _))) => {
            format!("it starts at step {s} logged at {t:.3}; the checkpoint's run started its log at step {ws}, {wt:.3}")
        }
        _ => "the checkpoint's run kept no log".to_string(),
    };
    Err(TrainError::Engine(Error::invalid(
        "log",
        format!(
            "{} holds {lines} lines of another run ({seen}); resuming would append to it and cut its later steps: give another --log, or replace it with --overwrite",
            log.display()
        ),
    )))
}

/// Seconds since the Unix epoch, for the log's wall-time axis (0 on a clock set before
/// 1970).
fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This process's resident memory in bytes (Linux: `VmRSS` of `/proc/self/status`), or
/// none where the system does not say.
fn resident_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
