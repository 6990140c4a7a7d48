//! Sums over parts held back and recorded several to a launch (shaders/col_sums.wgsl):
//! the second passes of split-K products, of bias-gradient column sums and of
//! LayerNorm's weight-gradient sums. Each is a small launch of its own otherwise (GPT-2
//! has about 125 a step); held back ([`Runtime::defer`]) they go [`MAX_JOBS`] to a
//! launch, recorded when the launch is full, when the parts they hold pass
//! [`HELD_BYTES`], before anything binds a block they read or write, before an
//! allocation that would raise the peak, and at a read, a transfer or the end of
//! backward. Each sum is formed in the order of the pass it
//! replaces, so results are the same bits.
//!
//! May call: `error`, `kernels::common`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::check_tensor;
use crate::error::Error;
use crate::memory::Block;
use crate::runtime::{Deferred, KernelKey, Runtime, grid, overlap, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/col_sums.wgsl");

/// The most sums one launch takes (the parameter slot holds five jobs' entries).
pub const MAX_JOBS: usize = 5;
/// Parts held back past this many bytes are summed at once. The peak is kept by the
/// runtime (an allocation that would raise it records held sums first); this bounds
/// what held parts keep from the cache's reuse (a split product's are megabytes).
pub const HELD_BYTES: u64 = 64 << 20;

/// One sum: `dst[d_off + (i / n) * d_rs + i % n] = alpha * s_i + beta * (that element)`
/// for i < len, where s_i sums `src[s_off + z * s_rs + i]` over the parts z, in the
/// order `lanes` gives (lane l sums parts l, l + lanes, ... in order, then the lanes
/// are added in order; 1: every part in order).
#[derive(Clone)]
pub struct Sum {
    /// The parts (f32); held until the sum is recorded.
    pub src: Tensor,
    /// Where part 0 starts in src's block, in elements.
    pub s_off: usize,
    /// Elements from one part to the next.
    pub s_rs: usize,
    /// Parts summed.
    pub parts: usize,
    /// Lanes a sum (a power of two up to 256).
    pub lanes: usize,
    /// Elements summed.
    pub len: usize,
    /// Elements in a row of dst.
    pub n: usize,
    /// The output (f32).
    pub dst: Tensor,
    /// Where its first row starts in dst's block, in elements.
    pub d_off: usize,
    /// Elements from one row of dst to the next.
    pub d_rs: usize,
    /// The sum's factor.
    pub alpha: f32,
    /// dst's factor (0: dst is not read).
    pub beta: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
struct Entry {
    s_off: u32,
    s_rs: u32,
    parts: u32,
    lanes: u32,
    len: u32,
    n: u32,
    d_off: u32,
    d_rs: u32,
    alpha: f32,
    beta: f32,
    first: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    jobs: u32,
    pad: [u32; 3],
    job: [Entry; MAX_JOBS],
}

impl Sum {
    /// Checks on the host every element the sum reads and writes.
    fn check(&self) -> Result<(), Error> {
        check_tensor("col_sums parts", &self.src, DType::F32)?;
        check_tensor("col_sums output", &self.dst, DType::F32)?;
        let bad = |what: &str| Err(Error::invalid("col_sums", what.to_string()));
        if self.len == 0 || self.parts == 0 || self.n == 0 || !self.len.is_multiple_of(self.n) {
            return bad("a sum of no elements or parts, or of rows that do not divide it");
        }
        if !self.lanes.is_power_of_two() || self.lanes > 256 {
            return bad("lanes a power of two up to 256");
        }
        let read = self.s_off + (self.parts - 1) * self.s_rs + self.len;
        let rows = self.len / self.n;
        let written = self.d_off + (rows - 1) * self.d_rs + self.n;
        if read > self.src.capacity() || written > self.dst.capacity() || (rows > 1 && self.d_rs < self.n) {
            return bad("a sum reaching past its blocks, or of overlapping output rows");
        }
        if read.max(written).max(self.len * self.lanes) > u32::MAX as usize {
            return bad("at most 2^32 elements");
        }
        Ok(())
    }

    fn workgroups(&self) -> usize {
        // One lane: four elements an invocation (shaders/col_sums.wgsl).
        self.len.div_ceil(if self.lanes == 1 { 1024 } else { 256 / self.lanes })
    }
}

/// Sums waiting for a launch (this runtime's [`Deferred`] of this kind).
#[derive(Default)]
pub struct Held {
    sums: Vec<Sum>,
    bytes: u64,
}

impl Deferred for Held {
    fn touches(&self, block: &Block) -> bool {
        self.sums
            .iter()
            .any(|s| overlap(s.src.block(), block) || overlap(s.dst.block(), block))
    }

    fn record(self: Box<Self>, rt: &Runtime) -> Result<(), Error> {
        for group in self.sums.chunks(per_launch(rt)) {
            launch(rt, group)?;
        }
        Ok(())
    }

    fn as_any(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The sums one launch of `rt`'s device takes: two storage bindings each.
fn per_launch(rt: &Runtime) -> usize {
    (rt.gpu.caps.limits.max_storage_buffers_per_shader_stage as usize / 2).clamp(1, MAX_JOBS)
}

/// Holds `sum` back to be recorded with others (see the module); checked now.
pub fn defer(rt: &Runtime, sum: Sum) -> Result<(), Error> {
    sum.check()?;
    // Sums of one launch run at once: one that writes what a held one reads or writes,
    // or reads what one writes (the LM head's chunks add into one weight gradient),
    // waits for them.
    let mut conflict = false;
    rt.defer::<Held>(|held| {
        conflict = held.sums.iter().any(|h| {
            overlap(h.dst.block(), sum.dst.block()) || overlap(h.src.block(), sum.dst.block()) || overlap(h.dst.block(), sum.src.block())
        });
        Ok(conflict)
    })?;
    let per = per_launch(rt);
    rt.defer::<Held>(|held| {
        held.bytes += sum.src.block().size();
        held.sums.push(sum);
        Ok(held.sums.len() >= per || held.bytes > HELD_BYTES)
    })
}

/// The template values of the variant of `jobs` sums.
pub fn variant(jobs: usize) -> Vec<(&'static str, String)> {
    let lines = |f: &dyn Fn(usize) -> String| (0..jobs).map(f).collect::<Vec<_>>().join("\n");
    let case = |k: usize, body: String| {
        if k + 1 == jobs {
            format!("        default: {{ {body} }}")
        } else {
            format!("        case {k}u: {{ {body} }}")
        }
    };
    vec![
        ("JOBS", jobs.to_string()),
        (
            "BINDINGS",
            lines(&|k| {
                format!(
                    "@group(0) @binding({}) var<storage, read_write> s{k}: array<f32>;\n@group(0) @binding({}) var<storage, read_write> d{k}: array<f32>;",
                    1 + 2 * k,
                    2 + 2 * k
                )
            }),
        ),
        ("LOADS", lines(&|k| case(k, format!("return s{k}[i];")))),
        ("LOAD_DSTS", lines(&|k| case(k, format!("return d{k}[i];")))),
        ("STORES", lines(&|k| case(k, format!("d{k}[i] = v;")))),
    ]
}

fn launch(rt: &Runtime, sums: &[Sum]) -> Result<(), Error> {
    let jobs = sums.len();
    if jobs == 0 {
        return Ok(());
    }
    let kernel = rt.kernel(
        KernelKey::new("col_sums", &[jobs as u32]),
        2 * jobs,
        || format!("col_sums x{jobs}"),
        || render("col_sums", SOURCE, &variant(jobs)),
    )?;
    let mut params = Params {
        jobs: jobs as u32,
        pad: [0; 3],
        job: [Entry::default(); MAX_JOBS],
    };
    let mut first = 0;
    for (e, s) in params.job.iter_mut().zip(sums) {
        *e = Entry {
            s_off: s.s_off as u32,
            s_rs: s.s_rs as u32,
            parts: s.parts as u32,
            lanes: s.lanes as u32,
            len: s.len as u32,
            n: s.n as u32,
            d_off: s.d_off as u32,
            d_rs: s.d_rs as u32,
            alpha: s.alpha,
            beta: s.beta,
            first: first as u32,
            pad: 0,
        };
        first += s.workgroups();
    }
    let bound: Vec<&Tensor> = sums.iter().flat_map(|s| [&s.src, &s.dst]).collect();
    // Every workgroup count fits u32: each sum's elements do (checked).
    rt.launch_with_work(&kernel, bytemuck::bytes_of(&params), &bound, grid(first as u32), None, 1)
}
