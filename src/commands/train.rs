//! `wgtrain train [CONFIG.toml] [--set section.key=value]... [--log FILE.jsonl]
//! [--adapter N] [--resume DIR] [--dashboard [ADDR]] [--profile-every N] [--tensorboard DIR]`:
//! trains as the config says;
//! Ctrl-C saves and exits. With a log, the run's memory record is saved beside it
//! (FILE.memory.json) for `wgtrain dashboard`; with --dashboard it is served live.
//!
//! May call: `wgtrain_engine::train`, `wgtrain_web`, `commands::dashboard`, `commands`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use clap::Args;

use super::{CliResult, Interrupted, watch_signals};
use wgtrain_engine::train::observe::tensorboard::TensorBoard;
use wgtrain_engine::train::observe::{Observer, Observers};
use wgtrain_engine::train::{Config, RunOptions, Trainer};
use wgtrain_web::recorder::{Recorder, record_path};
use wgtrain_web::{Dashboard, Options as DashboardOptions};

/// Arguments of `wgtrain train`.
#[derive(Args)]
pub struct TrainArgs {
    /// The TOML config (defaults apply without one).
    config: Option<PathBuf>,
    /// Override a key: --set train.lr=3e-4 (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Write one JSON line per step (and per evaluation) to this file: a new file, or the
    /// log of the run --resume continues (another run's log is refused unless
    /// --overwrite).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Continue from a checkpoint folder (or a folder whose `latest` names one). Alone
    /// (no CONFIG) it resumes with the config the checkpoint holds; --set may change the
    /// run's length or the data's path, not the model or the batches.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Serve the live dashboard at ADDR (default 127.0.0.1:8787; a non-loopback address
    /// gets a token, printed once). After training it keeps serving the finished run
    /// until Ctrl-C (or SIGTERM), unless --exit-when-done.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:8787")]
    dashboard: Option<std::net::SocketAddr>,
    /// With --dashboard: exit when training ends instead of serving the finished run.
    #[arg(long, requires = "dashboard")]
    exit_when_done: bool,
    /// The dashboard's token (generated for non-loopback addresses when not given).
    #[arg(long, requires = "dashboard")]
    token: Option<String>,
    /// Kernel timings for the dashboard's table (a `wgtrain bench --json` file).
    #[arg(long, value_name = "FILE", requires = "dashboard")]
    bench: Option<PathBuf>,
    /// Delete the checkpoints already in checkpoint.dir and replace the --log file where
    /// they are another run's (a fresh run into a folder that holds checkpoints or onto
    /// a log that holds a run, or a --resume into another folder or onto another run's
    /// log, is refused otherwise).
    #[arg(long)]
    overwrite: bool,
    /// Keep no memory record with the log (no timelines, no FILE.memory.json).
    #[arg(long, conflicts_with = "dashboard")]
    no_record: bool,
    /// Also write TensorBoard event files into DIR (`tensorboard --logdir DIR`): the
    /// loss, learning rate, speed, memory and evaluations of every step, as they come.
    #[arg(long, value_name = "DIR")]
    tensorboard: Option<PathBuf>,
    /// Time every launch of every N-th step: its log line carries the step's kernel
    /// table (shown by the dashboard beside the step's memory). Needs GPU timestamps.
    #[arg(long, value_name = "N", default_value_t = 0)]
    profile_every: u64,
}

/// Trains.
pub fn run(args: TrainArgs) -> CliResult {
    // `--resume DIR` alone: the checkpoint's own config, with any --set on top.
    let config = match (&args.config, &args.resume) {
        (None, Some(dir)) => {
            let (config, notes) = wgtrain_engine::train::checkpoint::state::resume_config(dir, &args.set)?;
            notes.iter().for_each(|n| eprintln!("{n}"));
            config
        }
        _ => Config::load(args.config.as_deref(), &args.set)?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicI32::new(0));
    // What a signal does depends on when it comes: during training it stops after the
    // step; after it, it only ends the dashboard's serving.
    let trained = Arc::new(AtomicBool::new(false));
    let trained_said = trained.clone();
    watch_signals(stop.clone(), received.clone(), move || {
        if trained_said.load(Ordering::SeqCst) {
            "training is done; closing the dashboard"
        } else {
            "stopping after this step (saving a checkpoint if configured); again to quit now without one"
        }
    })?;
    let ranks = Ranks::start(&config)?;
    let mut result = ranks.train(config, &args, stop, received, trained);
    // Over MPI a rank that fails ends every rank: the others would wait for it.
    if let Err(e) = &result
        && !e.is::<Interrupted>()
    {
        ranks.fail(&e.to_string());
    }
    // Over MPI every rank says it was interrupted before the ranks part: the first rank
    // to exit 143 makes mpirun end the rest.
    if ranks.mpi_size().is_some()
        && let Err(e) = &mut result
        && let Some(i) = e.downcast_mut::<Interrupted>()
    {
        eprintln!("{i}");
        i.said = true;
        // Every rank stopped after the same step, so all come here: none exits before
        // all have said it (Open MPI's MPI_Finalize does not always wait for them).
        ranks.barrier();
    }
    drop(ranks);
    result
}

/// This process's place in the run: the only one, or (`parallel.backend = "mpi"`) one
/// rank of several processes, where rank 0 alone prints, logs and serves.
struct Ranks {
    #[cfg(feature = "mpi")]
    mpi: Option<wgtrain_engine::parallel::mpi::MpiWorld>,
}

impl Ranks {
    /// Starts MPI when the config asks for it.
    fn start(config: &Config) -> Result<Ranks, Box<dyn std::error::Error>> {
        let over_mpi = config.parallel.backend == wgtrain_engine::train::config::Backend::Mpi;
        #[cfg(feature = "mpi")]
        {
            let mpi = over_mpi
                .then(wgtrain_engine::parallel::mpi::MpiWorld::init)
                .transpose()
                .map_err(|e| format!("parallel.backend = \"mpi\": {e}"))?;
            Ok(Ranks { mpi })
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = over_mpi;
            Ok(Ranks {})
        }
    }

    /// This process's rank (0 alone).
    fn rank(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.rank;
        }
        0
    }

    /// Over MPI: the hosts the ranks run on, and how they sum.
    fn spread(&self) -> String {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return match (m.hosts, m.shared_memory) {
                (1, true) => " on one host, summing through shared memory".into(),
                (1, false) => " on one host, summing through MPI messages".into(),
                (h, _) => format!(" on {h} hosts"),
            };
        }
        String::new()
    }

    /// Over MPI: what rank 0 says about how the ranks were placed.
    fn notes(&self) -> Vec<String> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.binding_note().into_iter().collect();
        }
        Vec::new()
    }

    /// Processes in the run over MPI (none in one process).
    fn mpi_size(&self) -> Option<usize> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return Some(m.size);
        }
        None
    }

    /// Over MPI: waits for every rank (`MPI_Barrier`).
    fn barrier(&self) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            m.barrier();
        }
    }

    /// The trainer of this process's rank.
    fn open(&self, config: Config, adapter: Option<&str>) -> Result<Trainer, Box<dyn std::error::Error>> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return Ok(Trainer::over_mpi(config, adapter, m)?);
        }
        Ok(Trainer::new(config, adapter)?)
    }

    /// The signal every rank exits with: the one any rank received (over MPI, each
    /// rank's is exchanged; the first rank's that has one wins).
    fn agreed_signal(&self, mine: i32) -> i32 {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use wgtrain_engine::parallel::Collective;
            if let Ok(all) = m.comm().all_gather_vecs(vec![mine as f32]) {
                return all.iter().map(|v| v[0] as i32).find(|&s| s != 0).unwrap_or(mine);
            }
        }
        mine
    }

    /// Over MPI: says why on standard error and ends every rank (MPI_Abort).
    fn fail(&self, why: &str) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            m.abort(why);
        }
        let _ = why;
    }

    fn train(
        &self,
        config: Config,
        args: &TrainArgs,
        stop: Arc<AtomicBool>,
        received: Arc<AtomicI32>,
        trained: Arc<AtomicBool>,
    ) -> CliResult {
        let rank = self.rank();
        let mut trainer = self.open(config, args.adapter.as_deref())?;
        if rank > 0 {
            // Rank 0 prints, logs and serves; the others train beside it quietly.
            let summary = trainer.run(&RunOptions {
                stop: Some(stop),
                resume: args.resume.clone(),
                ..Default::default()
            })?;
            trained.store(true, Ordering::SeqCst);
            if summary.interrupted {
                let signal = self.agreed_signal(received.load(Ordering::SeqCst));
                return Err(Box::new(Interrupted { signal, said: false }));
            }
            return Ok(());
        }
        train_rank0(self, trainer, args, stop, received, trained)
    }
}

/// Rank 0's (the only rank's) run: the notes, the log, the dashboard, the summary.
fn train_rank0(
    ranks: &Ranks,
    mut trainer: Trainer,
    args: &TrainArgs,
    stop: Arc<AtomicBool>,
    received: Arc<AtomicI32>,
    trained: Arc<AtomicBool>,
) -> CliResult {
    let stop_serving = stop.clone();
    for note in trainer.notes.iter().chain(&ranks.notes()) {
        eprintln!("{note}");
    }
    let p = &trainer.config.parallel;
    let devices = if p.backend == wgtrain_engine::train::config::Backend::Mpi {
        let n = trainer.world_size();
        let plural = if n == 1 { "" } else { "es" };
        format!(" as rank 0 of {n} MPI process{plural}{}: ZeRO stage {}", ranks.spread(), p.zero)
    } else if p.enabled() {
        let offload = if p.offload == wgtrain_engine::train::config::Offload::None {
            String::new()
        } else {
            format!(", {} offloaded to the host", p.offload)
        };
        format!(" and {} more device(s): ZeRO stage {}{offload}", trainer.world_size() - 1, p.zero)
    } else {
        String::new()
    };
    eprintln!(
        "training on {} ({}){devices}: {} parameters, {} steps",
        trainer.rt.gpu.report.name,
        trainer.rt.gpu.report.backend,
        trainer.parameter_count(),
        trainer.total_steps()
    );
    let recorder = ((args.log.is_some() && !args.no_record) || args.dashboard.is_some()).then(|| {
        let name = args
            .log
            .as_ref()
            .and_then(|l| l.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .filter(|n| wgtrain_web::server::valid_run_name(n).is_ok())
            .unwrap_or_else(|| "live".into());
        Recorder::new(&name, args.log.as_deref().map(record_path))
    });
    let tensorboard = match &args.tensorboard {
        Some(dir) => {
            let tb = TensorBoard::create(dir)?;
            eprintln!("tensorboard: {} (tensorboard --logdir {})", tb.path().display(), dir.display());
            Some(Arc::new(tb))
        }
        None => None,
    };
    let _dashboard = match args.dashboard {
        Some(addr) => {
            let bench = args.bench.as_deref().map(super::dashboard::read_bench).transpose()?;
            let d = Dashboard::start(DashboardOptions {
                addr,
                token: args.token.clone(),
                live: recorder.clone(),
                bench,
                ..Default::default()
            })?;
            eprintln!("dashboard: {}", d.url());
            Some(d)
        }
        None => None,
    };
    let options = RunOptions {
        log: args.log.clone(),
        resume: args.resume.clone(),
        progress: !args.quiet,
        overwrite: args.overwrite,
        stop: Some(stop),
        observer: observers(recorder.clone(), tensorboard),
        profile_every: args.profile_every,
    };
    let resume_with = resume_command(options.log.as_deref(), ranks.mpi_size());
    let result = trainer.run(&options);
    trained.store(true, Ordering::SeqCst);
    if result.is_err()
        && let Some(r) = &recorder
    {
        // Save what was recorded: the run stopped with an error.
        wgtrain_engine::train::Observer::finish(r.as_ref());
    }
    let summary = result?;
    if let Some(e) = &summary.last_eval {
        let acc = e.accuracy.map(|a| format!(", accuracy {:.2}%", 100.0 * a)).unwrap_or_default();
        let entropy = trainer
            .unigram_entropy
            .map(|h| format!(" (unigram entropy of the text: {h:.4})"))
            .unwrap_or_default();
        say!("eval loss {:.4}{acc}{entropy}", e.loss);
    }
    let finished_before = args.resume.is_some() && summary.losses.is_empty() && !summary.interrupted;
    if finished_before {
        say!(
            "nothing to train: the run already finished its {} steps (raise train.steps or train.epochs with --set to go on)",
            summary.steps
        );
    } else {
        say!(
            "{} steps in {:.1} s{}{}",
            summary.steps,
            summary.seconds,
            if summary.interrupted { " (interrupted)" } else { "" },
            summary
                .checkpoint
                .as_ref()
                .map(|p| format!("; checkpoint {}", p.display()))
                .unwrap_or_default()
        );
    }
    say!("{}", trainer.rt.alloc.summary());
    // Whoever asked for the dashboard keeps the finished run on screen until they are
    // done, on a terminal or not (a log's reader, a notebook, a remote shell).
    if let Some(d) = &_dashboard
        && !args.exit_when_done
        && !stop_serving.load(Ordering::SeqCst)
    {
        eprintln!("training finished; the dashboard stays at {} until Ctrl-C", d.url());
        while !stop_serving.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    if summary.interrupted
        && let Some(dir) = &summary.checkpoint
    {
        eprintln!("resume with: {resume_with} --resume {}", dir.display());
    }
    if summary.interrupted {
        return Err(Box::new(Interrupted {
            signal: ranks.agreed_signal(received.load(Ordering::SeqCst)),
            said: false,
        }));
    }
    Ok(())
}

/// The command that resumes this run (`--resume` and the folder follow): the
/// checkpoint holds the resolved config, so only the log needs naming again.
fn resume_command(log: Option<&std::path::Path>, mpi: Option<usize>) -> String {
    let launch = mpi.map(|n| format!("mpirun -n {n} ")).unwrap_or_default();
    match log {
        Some(log) => format!("{launch}wgtrain train --log {}", log.display()),
        None => format!("{launch}wgtrain train"),
    }
}

/// The run's observers: the dashboard's recorder and the TensorBoard writer, as asked.
fn observers(recorder: Option<Arc<Recorder>>, tensorboard: Option<Arc<TensorBoard>>) -> Option<Arc<dyn Observer>> {
    let all: Vec<Arc<dyn Observer>> = recorder
        .map(|r| r as Arc<dyn Observer>)
        .into_iter()
        .chain(tensorboard.map(|t| t as Arc<dyn Observer>))
        .collect();
    match all.len() {
        0 => None,
        1 => all.into_iter().next(),
        _ => Some(Arc::new(Observers(all))),
    }
}
