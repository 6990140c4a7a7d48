//! Fused causal attention (shaders/flash_attention.wgsl): the forward keeps only the
//! output and the per-row log-sum-exp; the backward recomputes the probabilities block
//! by block (FlashAttention-2), parallel over key blocks for dK and dV and over query
//! blocks for dQ, without atomics (bitwise repeatable). Nothing of size T x T exists in
//! device memory. Computed in f32 whatever the inputs' type (f32 or f16).
//!
//! The kernels are chosen by `kernels::attention_plan` (the paths, tiles and loops;
//! pure, testable without a GPU); this file renders the lane kernels and launches plans.
//! f32 qkv is computed in f32 throughout (no tensor cores). Tiles are sized to the
//! adapter's workgroup memory. Head sizes: multiples of 4 up to 128; any T; B * NH
//! beyond one dispatch dimension.
//!
//! May call: `error`, `kernels::attention_plan`, `kernels::common`,
//! `kernels::flash_attention_coop`, `kernels::flash_attention_tiled`, `memory`,
//! `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::attention_plan::{AttentionKernel, BR, KernelPlan, LaneKernel, Mode, plan_backward, plan_kernel};
use super::common::{ATTENTION_COMMON, check_contiguous, check_tensor, enables, require_f16};
use super::flash_attention_coop::{self as coop, AttentionTile, CoopMode};
use super::flash_attention_tiled as tiled;
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render, repeat_marked};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/flash_attention.wgsl");

pub use super::attention_plan::{MAX_HEAD, Path};

/// Checks that the adapter allows `path` for qkv of type `tq` and head size `d`.
fn check_path(rt: &Runtime, path: Path, tq: DType, d: usize) -> Result<(), Error> {
    let facts = &rt.gpu.caps.facts;
    if path == Path::Coop && Path::for_inputs(facts, tq, d) != Path::Coop {
        return Err(Error::invalid(
            "flash attention",
            format!(
                "the tensor-core path needs f16 qkv (got {tq:?}), a head size that is a multiple of 16 up to 128 (got {d}), and 16x16x16 f16 cooperative matrices with subgroups of 32 on '{}'",
                rt.gpu.report.name
            ),
        ));
    }
    if path == Path::Subgroup && Path::for_adapter(facts) == Path::Plain {
        return Err(Error::invalid(
            "flash attention",
            format!(
                "the subgroup path needs subgroups of at least 4 lanes, which '{}' does not grant",
                rt.gpu.report.name
            ),
        ));
    }
    if path == Path::Tiled && Path::for_adapter(facts) != Path::Tiled {
        return Err(Error::invalid(
            "flash attention",
            format!(
                "the register-tiled path needs subgroups of at least 8 lanes, which '{}' does not grant",
                rt.gpu.report.name
            ),
        ));
    }
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    b: u32,
    nh: u32,
    t: u32,
    c4: u32,
    scale: f32,
    blocks: u32,
    per: u32,
    pad: u32,
}

/// The sizes of an attention over qkv [B, T, 3C] with `nh` heads.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Heads.
    pub nh: usize,
    /// Head size.
    pub d: usize,
}

impl Dims {
    /// Checks qkv (a contiguous whole [B, T, 3C], C = nh * D, D a multiple of 4 up to
    /// 128) and returns its sizes.
    pub fn of(qkv: &Tensor, nh: usize) -> Result<Dims, Error> {
        let bad = || {
            Error::shape(
                "flash attention qkv",
                format!("a contiguous [B, T, 3C] at offset 0 with C = {nh} heads x D, D a multiple of 4 up to {MAX_HEAD}"),
                format!("{:?} (offset {})", qkv.shape(), qkv.offset()),
            )
        };
        let [b, t, c3] = *qkv.shape() else { return Err(bad()) };
        if nh == 0 || c3 % 3 != 0 || (c3 / 3) % nh != 0 || !qkv.is_contiguous() || qkv.offset() != 0 {
            return Err(bad());
        }
        let d = c3 / 3 / nh;
        if d == 0 || !d.is_multiple_of(4) || d > MAX_HEAD || b == 0 || t == 0 {
            return Err(bad());
        }
        Ok(Dims { b, t, nh, d })
    }

    fn c(&self) -> usize {
        self.nh * self.d
    }

    fn params(&self, blocks: u32, per: u32) -> Params {
        Params {
            b: self.b as u32,
            nh: self.nh as u32,
            t: self.t as u32,
            c4: (self.c() / 4) as u32,
            scale: 1.0 / (self.d as f32).sqrt(),
            blocks,
            per,
            pad: 0,
        }
    }

    fn blocks(&self, br: u32) -> u32 {
        (self.t as u32).div_ceil(br)
    }

    /// Causal (query, key) pairs over all batches and heads.
    fn pairs(&self) -> f64 {
        (self.b * self.nh) as f64 * (self.t * (self.t + 1) / 2) as f64
    }
}

/// A kernel of the family as launched: its plan and pipeline.
struct Chosen {
    kernel: std::sync::Arc<crate::runtime::Kernel>,
    plan: KernelPlan,
}

/// The kernel `mode` on `path` (the row dot has no tensor-core variant: it runs plain
/// there), planned and compiled.
fn kernel(rt: &Runtime, plan: KernelPlan, bindings: usize) -> Result<Chosen, Error> {
    let (mode, tq, td, d) = (plan.mode, plan.tq, plan.td, plan.d);
    let key = match plan.kernel {
        AttentionKernel::Coop { tile, whole, .. } => KernelKey::new(
            "flash_attention_coop",
            &[
                mode as u32,
                tq as u32,
                td as u32,
                d as u32 / 4,
                tile.br(),
                tile.bc,
                u32::from(tile.subgroup_sync) | u32::from(tile.prefetch) << 1 | u32::from(whole) << 2,
            ],
        ),
        AttentionKernel::Tiled { tile, chunks, .. } => KernelKey::new(
            "flash_attention_tiled",
            &[
                mode as u32,
                tq as u32,
                td as u32,
                d as u32 / 4,
                tile.br,
                tile.bc,
                tile.tm,
                chunks | u32::from(tile.prefetch) << 8,
            ],
        ),
        AttentionKernel::Lane(l) => KernelKey::new(
            "flash_attention",
            &[
                mode as u32,
                tq as u32,
                td as u32,
                l.d4,
                BR,
                l.bc,
                l.lanes,
                u32::from(l.subgroup()) | u32::from(l.unroll) << 1,
            ],
        ),
    };
    // Tensor-core kernels bind qkv (and dy, backward) again as vector views; the
    // register-tiled dQ binds y (it computes the row dot itself).
    let bindings = match plan.kernel {
        AttentionKernel::Coop { mode, .. } => bindings + if mode == CoopMode::Forward { 1 } else { 2 },
        _ => bindings + usize::from(plan.row_dot()),
    };
    let k = rt.kernel(
        key,
        bindings,
        || plan.to_string(),
        || match plan.kernel {
            AttentionKernel::Coop { mode, tile, whole } => coop::source(mode, td, d as u32, tile, whole),
            AttentionKernel::Tiled { mode, tile, chunks } => tiled::source(mode, tq, td, d as u32 / 4, tile, chunks),
            AttentionKernel::Lane(l) => source(&l, tq, td),
        },
    )?;
    Ok(Chosen { kernel: k, plan })
}

/// The WGSL of one lane kernel: the template rendered, its loops over a tile's rows
/// written out (`//#unroll` blocks, four rows a copy) if `unroll` (else kept as loops),
/// then each line holding `@k` repeated once per vec4 slice a lane holds (`@k` replaced
/// by 0, 1, ...).
pub fn source(l: &LaneKernel, tq: DType, td: DType) -> Result<String, Error> {
    let wgsl = render("flash_attention", SOURCE, &variant(l, tq, td))?;
    // A thread's loads of a streamed tile: BC * D4 vec4s over the workgroup's threads.
    let wgsl = repeat_marked(&wgsl, "@L", (l.bc * l.d4).div_ceil(l.threads()));
    Ok(repeat_marked(&wgsl, "@k", l.d4 / l.lanes))
}

/// The template values of one variant: `mode` 0 forward, 1 the row dot D, 2 dK and
/// dV, 3 dQ, 4 the row dot also writing dy in f16; `bc` rows per tile.
pub fn variant(l: &LaneKernel, tq: DType, td: DType) -> Vec<(&'static str, String)> {
    let (mode, d4, bc) = (l.mode, l.d4, l.bc);
    let flag = |on: bool| on.to_string();
    vec![
        ("ATTENTION_COMMON", ATTENTION_COMMON.into()),
        ("ENABLE", enables(&[tq, td, if mode == Mode::RowDotCast { DType::F16 } else { tq }])),
        ("TQ", tq.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("D4", d4.to_string()),
        ("BR", BR.to_string()),
        ("BC", bc.to_string()),
        ("ROWS4", format!("{}{}", bc / 4, if l.unroll { "" } else { " loop" })),
        ("R", l.lanes.to_string()),
        ("WG", l.threads().to_string()),
        ("TILE", (bc * (d4 + 1)).to_string()),
        ("MODE", (mode as u32).to_string()),
        ("SUBGROUP", flag(l.subgroup())),
        ("FWD", flag(mode == Mode::Forward)),
        ("PRE", flag(mode == Mode::RowDot || mode == Mode::RowDotCast)),
        ("CAST", flag(mode == Mode::RowDotCast)),
        ("BWD", flag(mode == Mode::KeyValue || mode == Mode::Query)),
        ("BWD_KV", flag(mode == Mode::KeyValue)),
        ("KV1", flag(mode == Mode::KeyValue && l.rows == 1)),
        ("KV2", flag(l.rows == 2)),
        ("BWD_Q", flag(mode == Mode::Query)),
        ("KV_TILES", flag(mode == Mode::Forward || mode == Mode::Query)),
    ]
}

/// What the forward keeps for backward besides qkv: the output and the log-sum-exp.
pub struct FlashSaved {
    /// The output y [B, T, C] (qkv's type).
    pub y: Tensor,
    /// Log-sum-exp of each row's scaled scores [B, NH, T], f32.
    pub lse: Tensor,
}

/// y [B, T, C] (qkv's type) = causal attention of qkv [B, T, 3C] with `nh` heads, on
/// `path`; also the log-sum-exp for backward.
pub fn forward_on(rt: &Runtime, qkv: &Tensor, nh: usize, path: Path, label: &str) -> Result<FlashSaved, Error> {
    forward_tiled(rt, qkv, nh, path, None, label)
}

/// [`forward_on`] with the tensor-core path's tile forced (`wgtrain bench --tune`).
pub fn forward_tiled(
    rt: &Runtime,
    qkv: &Tensor,
    nh: usize,
    path: Path,
    tile: Option<AttentionTile>,
    label: &str,
) -> Result<FlashSaved, Error> {
    let dims = Dims::of(qkv, nh)?;
    let dt = qkv.dtype();
    check_tensor("flash attention qkv", qkv, dt)?;
    require_f16(rt, &[dt])?;
    check_path(rt, path, dt, dims.d)?;
    let facts = &rt.gpu.caps.facts;
    let plan = plan_kernel(
        facts,
        &rt.overrides().attention_tiles,
        Mode::Forward,
        dt,
        dt,
        dims.d,
        dims.t,
        path,
        tile,
    )?;
    let k = kernel(rt, plan, 3)?;
    let y = Tensor::empty(rt, &[dims.b, dims.t, dims.c()], dt, Category::Activation, label)?;
    let lse = Tensor::empty(
        rt,
        &[dims.b, dims.nh, dims.t],
        DType::F32,
        Category::Activation,
        &format!("{label}.lse"),
    )?;
    let blocks = dims.blocks(k.plan.br());
    // Q K^T and P V: every path makes one pass over the keys.
    let products = 4.0;
    let bound = [qkv, &y, &lse, qkv];
    rt.launch_with_work(
        &k.kernel,
        bytemuck::bytes_of(&dims.params(blocks, k.plan.per())),
        &bound[..3 + usize::from(k.plan.views())],
        grid(blocks * (dims.b * dims.nh) as u32),
        Some(products * dims.pairs() * dims.d as f64),
        1,
    )?;
    Ok(FlashSaved { y, lse })
}

/// dqkv [B, T, 3C] (f32) from dy [B, T, C] (contiguous, f32 or qkv's type), on `path`.
pub fn backward_on(
    rt: &Runtime,
    qkv: &Tensor,
    nh: usize,
    saved: &FlashSaved,
    dy: &Tensor,
    path: Path,
    label: &str,
) -> Result<Tensor, Error> {
    backward_tiled(rt, qkv, nh, saved, dy, path, BackwardTiles::default(), label)
}

/// Tensor-core tiles forced for the backward kernels (`wgtrain bench --tune`, which also
/// times each kernel's tiles with the other's picked); `None` picks.
#[derive(Clone, Copy, Debug, Default)]
pub struct BackwardTiles {
    /// dQ's tile.
    pub query: Option<AttentionTile>,
    /// dK dV's tile.
    pub key_value: Option<AttentionTile>,
}

impl BackwardTiles {
    /// The same tile (or the pick) for both kernels.
    pub fn both(tile: Option<AttentionTile>) -> BackwardTiles {
        BackwardTiles {
            query: tile,
            key_value: tile,
        }
    }
}

/// [`backward_on`] with the tensor-core path's tile forced (`wgtrain bench --tune`).
#[allow(clippy::too_many_arguments)]
pub fn backward_tiled(
    rt: &Runtime,
    qkv: &Tensor,
    nh: usize,
    saved: &FlashSaved,
    dy: &Tensor,
    path: Path,
    tiles: BackwardTiles,
    label: &str,
) -> Result<Tensor, Error> {
    let dims = Dims::of(qkv, nh)?;
    let (tq, td) = (qkv.dtype(), dy.dtype());
    let shape = [dims.b, dims.t, dims.c()];
    check_contiguous("flash attention dy", dy, &shape)?;
    check_contiguous("flash attention y", &saved.y, &shape)?;
    check_contiguous("flash attention lse", &saved.lse, &[dims.b, dims.nh, dims.t])?;
    check_tensor("flash attention y", &saved.y, tq)?;
    check_tensor("flash attention lse", &saved.lse, DType::F32)?;
    if dy.offset() != 0 || saved.y.offset() != 0 || saved.lse.offset() != 0 || !matches!(td, DType::F32 | DType::F16) {
        return Err(Error::shape(
            "flash attention dy",
            "whole f32 or f16 tensors (offset 0)",
            format!("{td:?} at offset {}", dy.offset()),
        ));
    }
    let rows = dims.b * dims.nh * dims.t;
    let dvec = Tensor::empty(
        rt,
        &[dims.b, dims.nh, dims.t],
        DType::F32,
        Category::Temporary,
        &format!("{label}.rowdot"),
    )?;
    // The tensor-core kernels read dy 16 bytes at a time in f16 (they round it to f16
    // for their products anyway): an f32 dy is written in f16 by the row dot, which
    // reads it. The register-tiled dQ computes D itself (it runs first), else the
    // row-dot kernel runs before both.
    require_f16(rt, &[tq, td])?;
    check_path(rt, path, tq, dims.d)?;
    let facts = &rt.gpu.caps.facts;
    let spec = &rt.overrides().attention_tiles;
    let plan = plan_backward(facts, spec, tq, td, dims.d, dims.t, path, tiles.query, tiles.key_value)?;
    let dy16 = if plan.dy16 {
        Some(Tensor::empty(
            rt,
            &shape,
            DType::F16,
            Category::Temporary,
            &format!("{label}.dy16"),
        )?)
    } else {
        None
    };
    let query = kernel(rt, plan.query, 5)?;
    let key_value = kernel(rt, plan.key_value, 5)?;
    if let Some(pre_plan) = plan.pre {
        let pre_bindings = if plan.dy16 { 4 } else { 3 };
        let pre = kernel(rt, pre_plan, pre_bindings)?;
        // D / 4 threads a row.
        let lanes = match pre_plan.kernel {
            AttentionKernel::Lane(l) => l.lanes,
            _ => 1,
        };
        let rows_per = (BR * lanes) as usize / (dims.d / 4);
        let pre_bound = [&saved.y, dy, &dvec, dy16.as_ref().unwrap_or(dy)];
        rt.launch(
            &pre.kernel,
            bytemuck::bytes_of(&dims.params(0, 0)),
            &pre_bound[..pre_bindings],
            grid(rows.div_ceil(rows_per) as u32),
        )?;
    }
    let dy = dy16.as_ref().unwrap_or(dy);
    let dqkv = Tensor::empty(rt, qkv.shape(), DType::F32, Category::Temporary, label)?;
    for (k, products) in [(query, 6.0), (key_value, 8.0)] {
        let blocks = dims.blocks(k.plan.br());
        let simt = [qkv, dy, &saved.lse, &dvec, &dqkv, &saved.y];
        let coop = [qkv, dy, &saved.lse, &dvec, &dqkv, qkv, dy];
        let bound: &[&Tensor] = if k.plan.views() {
            &coop
        } else {
            &simt[..5 + usize::from(k.plan.row_dot())]
        };
        rt.launch_with_work(
            &k.kernel,
            bytemuck::bytes_of(&dims.params(blocks, k.plan.per())),
            bound,
            grid(blocks * (dims.b * dims.nh) as u32),
            Some(products * dims.pairs() * dims.d as f64),
            4,
        )?;
    }
    Ok(dqkv)
}

/// The path for qkv with `nh` heads on this adapter ([`Path::for_inputs`]).
fn path_for(rt: &Runtime, qkv: &Tensor, nh: usize) -> Result<Path, Error> {
    let dims = Dims::of(qkv, nh)?;
    Ok(Path::for_inputs(&rt.gpu.caps.facts, qkv.dtype(), dims.d))
}

/// [`forward_on`] on the path the adapter and the inputs allow.
pub fn forward(rt: &Runtime, qkv: &Tensor, nh: usize, label: &str) -> Result<FlashSaved, Error> {
    forward_on(rt, qkv, nh, path_for(rt, qkv, nh)?, label)
}

/// [`backward_on`] on the path the adapter and the inputs allow (the forward's).
pub fn backward(rt: &Runtime, qkv: &Tensor, nh: usize, saved: &FlashSaved, dy: &Tensor, label: &str) -> Result<Tensor, Error> {
    backward_on(rt, qkv, nh, saved, dy, path_for(rt, qkv, nh)?, label)
}
