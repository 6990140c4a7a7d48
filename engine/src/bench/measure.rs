//! How the kernel benchmarks measure, so that a row can be trusted: each case is run
//! until its time is stable (windows of repeats whose medians agree within 3%, after
//! at least 300 ms: an idle GPU needs time to raise its clocks, a fixed count is not
//! enough), then timed over enough repeats (at least 15 and 200 ms) and reported as the
//! median with its spread, (p90 - p10) / median; a spread over 10%, or clocks that did
//! not settle within 5 s of warm-up, flags the row with the reason and the repeats'
//! range. A quick run (`--quick`) warms and times each row for a third to a fifth of
//! that and does not re-settle the clock. Also the inputs
//! (a seeded generator) and the check against the f64 reference every case makes.
//! Before a full run, [`settle`] brings an idle device to its working speed; a row whose
//! first call spent long building pipelines (the device idling meanwhile) is settled
//! again before its warm-up.
//!
//! May call: `bench::record`, `error`, `kernels::{map, matmul, tolerance}`, `memory`,
//! `runtime`,
//! `tensor`. Called by: `bench::{kernels, gpt2}`, the CLI (`settle`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::record::{BenchRecord, median};
use crate::error::Error;
use crate::kernels::matmul::MatmulOptions;
use crate::kernels::matmul_params::MatmulVariant;
use crate::kernels::tolerance::compare;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Least warm-up time.
const MIN_WARMUP: Duration = Duration::from_millis(300);
/// Most warm-up time before a row is flagged as unsettled.
const MAX_WARMUP: Duration = Duration::from_secs(5);
/// Repeats per warm-up window.
const WINDOW: usize = 5;
/// Windows' medians closer than this are stable.
const STABLE: f64 = 0.03;
/// Least timed repeats, and least total time timed.
const MIN_REPEATS: usize = 15;
const MIN_TIMED: Duration = Duration::from_millis(200);
const MAX_REPEATS: usize = 200;
/// A spread beyond this flags the row.
pub const MAX_SPREAD: f64 = 0.10;
/// Elements or rows checked against the reference in large cases.
pub const SAMPLES: usize = 48;
/// Launches of a case per timed sample (`wgtrain bench --launches`): 1 times each call
/// from an idle device, as the PyTorch peers' script times theirs; more time calls
/// back to back, as a training step runs them, and report the time of one.
static LAUNCHES: AtomicUsize = AtomicUsize::new(1);

/// Quick runs (`wgtrain bench --quick`, a smoke check of every row): shorter warm-up and
/// timing, and no re-settling of the clock after a row's pipelines were built (on a CPU
/// adapter the settling load alone took seconds a row).
static QUICK: AtomicUsize = AtomicUsize::new(0);

/// Times the rows after it as a quick run (see [`QUICK`]) or a full one.
pub fn set_quick(quick: bool) {
    QUICK.store(usize::from(quick), Ordering::Relaxed);
}

fn quick() -> bool {
    QUICK.load(Ordering::Relaxed) != 0
}

/// Called with each row as it is recorded (the CLI prints progress through it).
static PROGRESS: std::sync::OnceLock<fn(&BenchRecord)> = std::sync::OnceLock::new();

/// Sets the function told of each row as it is recorded (once per process).
pub fn on_row(f: fn(&BenchRecord)) {
    let _ = PROGRESS.set(f);
}

/// Sets the launches per timed sample (at least 1) for the rows timed after it.
pub fn set_launches(n: usize) {
    LAUNCHES.store(n.max(1), Ordering::Relaxed);
}

/// The launches per timed sample.
pub fn launches() -> usize {
    LAUNCHES.load(Ordering::Relaxed)
}

/// A matmul row under forced K slices that the shape cannot take is left out (said on
/// standard error) rather than ending the run; any other error ends it.
pub fn unless_unsplittable(row: Result<BenchRecord, Error>) -> Result<Option<BenchRecord>, Error> {
    match row {
        Err(Error::Invalid { op, reason }) if splits().is_some() && op == "matmul K slices" => {
            eprintln!("row left out: {reason}");
            Ok(None)
        }
        row => row.map(Some),
    }
}

/// K slices forced on the matmul rows (`wgtrain bench --splits`; 0: the shape picks).
static SPLITS: AtomicUsize = AtomicUsize::new(0);

/// Forces `n` K slices on the matmul rows timed after it (`None`: the shape picks).
pub fn set_splits(n: Option<usize>) {
    SPLITS.store(n.unwrap_or(0), Ordering::Relaxed);
}

/// The K slices forced on the matmul rows, if any.
pub fn splits() -> Option<usize> {
    Some(SPLITS.load(Ordering::Relaxed)).filter(|&n| n > 0)
}

/// A matmul row's options: the variant `forced` names, with the forced K slices.
pub fn matmul_options(forced: MatmulVariant) -> MatmulOptions<'static> {
    MatmulOptions {
        split_k: splits(),
        ..forced.options()
    }
}

/// A matmul row's record, saying in `extra` the K slices it was forced to, if any.
pub fn with_splits(mut row: BenchRecord) -> BenchRecord {
    if let Some(n) = splits() {
        if !row.extra.is_object() {
            row.extra = serde_json::json!({});
        }
        row.extra["splits"] = n.into();
    }
    row
}

/// A seeded xorshift generator: the same inputs on every machine.
pub struct Rng(pub u64);

impl Rng {
    /// The next raw 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32))
            .collect()
    }
    /// An index below `n`.
    pub fn index(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// A number in [lo, hi).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

/// Softmax of one row, in f64 (the references' softmax).
pub fn softmax_ref(row: &[f64]) -> Vec<f64> {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = row.iter().map(|x| (x - m).exp()).sum();
    row.iter().map(|x| (x - m).exp() / s).collect()
}

/// `data` on the device as `dtype` (f16 rounds).
pub fn upload(rt: &Runtime, data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor, Error> {
    match dtype {
        DType::F16 => Tensor::from_f32_as_f16(rt, data, shape, Category::Input, "bench"),
        _ => Tensor::from_f32(rt, data, shape, Category::Input, "bench"),
    }
}

/// `x` as the device stores it in `dtype`, widened.
pub fn stored(x: f32, dtype: DType) -> f64 {
    if dtype == DType::F16 {
        half::f16::from_f32(x).to_f64()
    } else {
        x as f64
    }
}

/// A timing: the median, the spread, the repeats, and why not to trust it, if so.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Median microseconds.
    pub median_us: f64,
    /// (p90 - p10) / median.
    pub spread: f64,
    /// Timed repeats.
    pub repeats: usize,
    /// The reason to distrust the row, if any.
    pub flag: Option<String>,
    /// Calls per timed sample, back to back (the median is per call).
    pub launches: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// A first call at least this slow built pipelines (drivers compile on first use, the
/// tensor-core attention for seconds): the device idled meanwhile and its clock fell.
const COMPILED: Duration = Duration::from_millis(500);

/// Times `f` (which records launches) as the module says. A first, untimed call builds
/// the pipelines; when that took long enough for the device to idle down, it is settled
/// again ([`settle_clock`]) before the warm-up.
pub fn time(rt: &Runtime, mut one: impl FnMut() -> Result<(), Error>) -> Result<Timing, Error> {
    let launches = launches();
    let mut f = || -> Result<(), Error> {
        for _ in 0..launches {
            one()?;
        }
        Ok(())
    };
    let first = Instant::now();
    rt.time(&mut f)?;
    let quick = quick();
    if first.elapsed() >= COMPILED && !quick {
        settle_clock(rt, RESETTLE_MIN, RESETTLE_QUIET)?;
    }
    let (min_warmup, max_warmup, min_timed) = if quick {
        (MIN_WARMUP / 3, MAX_WARMUP / 5, MIN_TIMED / 4)
    } else {
        (MIN_WARMUP, MAX_WARMUP, MIN_TIMED)
    };
    let start = Instant::now();
    let mut last: Option<f64> = None;
    let mut unsettled = false;
    loop {
        let mut window = Vec::with_capacity(WINDOW);
        for _ in 0..WINDOW {
            window.push(rt.time(&mut f)?);
        }
        let m = median(&mut window);
        let stable = last.is_some_and(|l| (m - l).abs() <= STABLE * l.max(1e-12));
        if stable && start.elapsed() >= min_warmup {
            break;
        }
        if start.elapsed() >= max_warmup {
            unsettled = true;
            break;
        }
        last = Some(m);
    }
    let timed = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < MAX_REPEATS && (samples.len() < MIN_REPEATS || timed.elapsed() < min_timed) {
        samples.push(rt.time(&mut f)? * 1e6 / launches as f64);
    }
    let median_us = median(&mut samples);
    let spread = (percentile(&samples, 0.9) - percentile(&samples, 0.1)) / median_us.max(1e-12);
    let mut reasons = Vec::new();
    if unsettled {
        reasons.push(format!(
            "time not stable within {STABLE:.0e} after {:.1} s of warm-up",
            max_warmup.as_secs_f64()
        ));
    }
    if spread > MAX_SPREAD {
        // What varied: the repeats' range, and why on a CPU adapter.
        let (lo, hi) = (percentile(&samples, 0.1), percentile(&samples, 0.9));
        reasons.push(format!(
            "spread {:.0}% over {} repeats: p10 {lo:.1} us, p90 {hi:.1} us{}",
            100.0 * spread,
            samples.len(),
            if rt.gpu.report.device_type == "cpu" {
                " (a CPU adapter shares its cores with the host's other work)"
            } else {
                ""
            }
        ));
    }
    Ok(Timing {
        median_us,
        spread,
        repeats: samples.len(),
        flag: (!reasons.is_empty()).then(|| reasons.join("; ")),
        launches,
    })
}

/// What a row did: its work (for the rates) and its check against the reference.
pub struct Row<'a> {
    /// FLOPs of one repetition (0: no rate).
    pub flops: f64,
    /// Bytes read and written by one repetition (0: no rate).
    pub bytes: f64,
    /// Sampled results.
    pub got: &'a [f32],
    /// The f64 reference of the same samples.
    pub want: &'a [f64],
    /// Absolute and relative tolerance.
    pub tol: (f64, f64),
}

/// The record of `kernel` at `shape` timed as `t`.
pub fn record(kernel: &str, dtype: DType, shape: &[usize], t: &Timing, row: Row<'_>) -> BenchRecord {
    let (abs, rel, ok) = compare(row.got, row.want, row.tol.0, row.tol.1);
    let us = t.median_us;
    let r = BenchRecord {
        kernel: kernel.into(),
        dtype: dtype.wgsl().into(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        median_us: us,
        gflops: (row.flops > 0.0).then(|| row.flops / us / 1e3),
        gbps: (row.bytes > 0.0).then(|| row.bytes / us / 1e3),
        max_abs_err: Some(abs),
        max_rel_err: Some(rel),
        ok,
        spread: Some(t.spread),
        repeats: Some(t.repeats as u32),
        flag: t.flag.clone(),
        extra: if t.launches > 1 {
            serde_json::json!({ "launches": t.launches })
        } else {
            serde_json::Value::Null
        },
    };
    if let Some(progress) = PROGRESS.get() {
        progress(&r);
    }
    r
}

/// How long [`settle`] ran, and whether the device's speed plateaued.
#[derive(Clone, Debug)]
pub struct Settled {
    /// Seconds of sustained load.
    pub seconds: f64,
    /// The load's first and last batch times, microseconds.
    pub first_us: f64,
    /// The last.
    pub last_us: f64,
    /// Whether no batch got faster by more than 2% over the last `QUIET` seconds.
    pub plateau: bool,
}

/// Least and most settling time, and how long the speed must stay flat.
const SETTLE_MIN: Duration = Duration::from_secs(10);
const SETTLE_MAX: Duration = Duration::from_secs(45);
const QUIET: Duration = Duration::from_secs(5);
/// The same after a row's pipelines were built.
const RESETTLE_MIN: Duration = Duration::from_secs(3);
const RESETTLE_QUIET: Duration = Duration::from_secs(2);

/// Brings a device that was idle (a freshly started machine's GPU idles at a few
/// hundred MHz and leaves that state in steps) to its working speed before the first
/// row: touches 2 GiB of fresh device memory (capped by the adapter's largest buffer),
/// then runs a sustained matmul load until its time has not improved by more than 2%
/// for `QUIET` seconds (at least `SETTLE_MIN`, at most `SETTLE_MAX`). A row's own
/// warm-up cannot tell a settled slow clock from the real one; this can.
pub fn settle(rt: &Runtime) -> Result<Settled, Error> {
    use crate::kernels::map::fill;
    let chunk = (rt.gpu.caps.limits.max_storage_buffer_binding_size as usize / 4).min(1 << 28);
    let mut touched = 0usize;
    while touched < 1 << 29 {
        let t = Tensor::empty(rt, &[chunk], DType::F32, Category::Temporary, "bench.settle")?;
        fill(rt, &t, 1.0)?;
        rt.sync()?;
        touched += chunk;
    }
    settle_clock(rt, SETTLE_MIN, QUIET)
}

/// The clock part of [`settle`]: a sustained matmul load until its time has not improved
/// by more than 2% for `quiet` (at least `min`, at most `SETTLE_MAX`).
pub fn settle_clock(rt: &Runtime, min: Duration, quiet: Duration) -> Result<Settled, Error> {
    use crate::kernels::matmul::{MatmulOptions, matmul_into};
    let n = 2048;
    let mut rng = Rng(99);
    let a = upload(rt, &rng.vec(n * n, -1.0, 1.0), &[n, n], DType::F32)?;
    let b = upload(rt, &rng.vec(n * n, -1.0, 1.0), &[n, n], DType::F32)?;
    let c = Tensor::empty(rt, &[n, n], DType::F32, Category::Temporary, "bench.settle")?;
    let opts = MatmulOptions::default();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut best_at = start;
    let mut first = None;
    loop {
        let last = rt.time(|| {
            for _ in 0..8 {
                matmul_into(rt, &a, &b, &c, &opts)?;
            }
            Ok(())
        })? * 1e6;
        first.get_or_insert(last);
        if last < best * 0.98 {
            best_at = Instant::now();
        }
        best = best.min(last);
        let quiet = best_at.elapsed() >= quiet;
        if (quiet && start.elapsed() >= min) || start.elapsed() >= SETTLE_MAX {
            return Ok(Settled {
                seconds: start.elapsed().as_secs_f64(),
                first_us: first.unwrap_or(last),
                last_us: last,
                plateau: quiet,
            });
        }
    }
}
