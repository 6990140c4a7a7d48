//! Fused causal attention (shaders/flash_attention.wgsl): the forward keeps only the
//! output and the per-row log-sum-exp; the backward recomputes the probabilities block
//! by block (FlashAttention-2), parallel over key blocks for dK and dV and over query
//! blocks for dQ, without atomics (bitwise repeatable). Nothing of size T x T exists in
//! device memory. Computed in f32 whatever the inputs' type (f32 or f16).
//!
//! Paths, chosen by the adapter and the inputs: `Coop` (tensor cores through
//! cooperative matrices, `kernels::flash_attention_coop`) for f16 qkv and head sizes that
//! are multiples of 16 where 16x16x16 f16 -> f32 and subgroups of 32 are granted;
//! otherwise `Tiled` where subgroups of at least 8 are granted: the forward and dQ on
//! register-tiled SIMT kernels (`kernels::flash_attention_tiled`) for head sizes that
//! are multiples of 32 where a tile fits, dK dV (and whatever no tile fits) on the lane
//! kernels, with two key rows a thread at head sizes 32 and 64; otherwise `Subgroup` (a
//! row's lanes split its head dimension, their partial dot products summed with
//! subgroup shuffles) where subgroups of at least 4 are granted, else `Plain` (a thread
//! per row, workgroup memory only).
//! f32 qkv is computed in f32 throughout (no tensor cores). Tiles are sized to the
//! adapter's workgroup memory. Head sizes: multiples of 4 up to 128; any T; B * NH
//! beyond one dispatch dimension.
//!
//! May call: `error`, `kernels::common`, `kernels::flash_attention_coop`,
//! `kernels::flash_attention_tiled`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{ATTENTION_COMMON, check_contiguous, check_tensor, enables, require_f16};
use super::flash_attention_coop::{self as coop, CoopMode, CoopTile};
use super::flash_attention_tiled::{self as tiled, TiledMode};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render, repeat_marked};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/flash_attention.wgsl");

/// Rows (queries, or keys in dK/dV) per workgroup of the lane kernels. On the H100
/// (f32, head size 64) 32 rows took dK dV from 1248 to 1813 us, dQ from 1037 to 1994
/// and the forward from 737 to 1421.
const BR: u32 = 64;

/// Largest head size.
pub const MAX_HEAD: usize = 128;

/// How a row's work is spread over threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// One thread per row; workgroup memory only.
    Plain,
    /// Several lanes per row (4 where D / 4 allows), splitting the head dimension and
    /// summing their partial dot products with subgroup shuffles.
    Subgroup,
    /// Tensor cores (cooperative matrices): f16 qkv, head sizes multiples of 16.
    Coop,
    /// Register-tiled SIMT kernels for the forward and dQ (each thread owns a block of
    /// scores and of outputs; head sizes multiples of 32, subgroups of at least 8); dK
    /// dV on the lane kernel with two key rows a thread ([`Path::rows`]); a kernel
    /// whose tile does not fit the adapter's workgroup memory runs as on `Subgroup`
    /// (`kernels::flash_attention_tiled::pick`).
    Tiled,
}

impl Path {
    /// Threads per row of the SIMT kernel `mode` (0 forward, 1 row dot, 2 dK dV, 3 dQ)
    /// at head size 4 `d4`: on the subgroup path 4 for dK dV and 2 for the others, or
    /// fewer where `d4` does not divide by them (each lane takes `d4 / lanes` vec4s). On
    /// the H100 at head size 64 (f32), 2 lanes ran the forward in 1.10 ms and dQ in 1.22
    /// (4 lanes: 1.24 and 1.35; 1 lane: 1.78 and 3.74) and dK dV in 1.82 (4 lanes: 1.44).
    pub fn lanes(self, d4: u32, mode: u32) -> u32 {
        if self.rows(d4, mode) == 2 {
            return 8;
        }
        let most = if mode == Mode::KeyValue as u32 { 4 } else { 2 };
        match self {
            Path::Subgroup | Path::Tiled if most == 4 && d4.is_multiple_of(4) => 4,
            Path::Subgroup | Path::Tiled if d4.is_multiple_of(2) => 2,
            _ => 1,
        }
    }

    /// Rows a thread of the lane kernel `mode` holds: 2 for dK dV on the tiled path
    /// (subgroups of at least 8) at head sizes 32 and 64, with 8 lanes a pair of rows, so
    /// that each vec4 read from a query tile serves both rows (1 on `kv=lane` in
    /// `WGTRAIN_TILED_ATTENTION`); else 1. On the H100 (f32, head size 64) two rows took
    /// dK dV from 1245 to 1088 us. (dQ with two query rows a thread took 885-889 us
    /// against the tiled dQ's 849, so dQ stays tiled.)
    pub fn rows(self, d4: u32, mode: u32) -> u32 {
        if self == Path::Tiled && mode == Mode::KeyValue as u32 && matches!(d4, 8 | 16) && !tiled::one_key_row() {
            2
        } else {
            1
        }
    }

    /// Threads a workgroup of the SIMT kernel `mode` at head size 4 `d4`.
    pub fn threads(self, d4: u32, mode: u32) -> u32 {
        BR / self.rows(d4, mode) * self.lanes(d4, mode)
    }

    /// The path for qkv of type `tq` and head size `d`: tensor cores where the adapter
    /// and the inputs allow, else [`Path::for_adapter`].
    pub fn for_inputs(rt: &Runtime, tq: DType, d: usize) -> Path {
        if coop::eligible(rt.gpu.caps.coop_f16_16x16x16(), rt.gpu.caps.subgroup_size, tq, d) {
            Path::Coop
        } else {
            Path::for_adapter(rt)
        }
    }

    /// The SIMT path the adapter allows: the register-tiled kernels where subgroups of
    /// at least 8 lanes are granted, the lane kernels where subgroups of at least 4 are.
    pub fn for_adapter(rt: &Runtime) -> Path {
        if rt.gpu.caps.subgroup && rt.gpu.caps.subgroup_size.0 >= 8 {
            Path::Tiled
        } else if rt.gpu.caps.subgroup && rt.gpu.caps.subgroup_size.0 >= 4 {
            Path::Subgroup
        } else {
            Path::Plain
        }
    }

    fn check(self, rt: &Runtime, tq: DType, d: usize) -> Result<(), Error> {
        if self == Path::Coop && Path::for_inputs(rt, tq, d) != Path::Coop {
            return Err(Error::invalid(
                "flash attention",
                format!(
                    "the tensor-core path needs f16 qkv (got {tq:?}), a head size that is a multiple of 16 up to 128 (got {d}), and 16x16x16 f16 cooperative matrices with subgroups of 32 on '{}'",
                    rt.gpu.report.name
                ),
            ));
        }
        if self == Path::Subgroup && Path::for_adapter(rt) == Path::Plain {
            return Err(Error::invalid(
                "flash attention",
                format!(
                    "the subgroup path needs subgroups of at least 4 lanes, which '{}' does not grant",
                    rt.gpu.report.name
                ),
            ));
        }
        if self == Path::Tiled && Path::for_adapter(rt) != Path::Tiled {
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
}

/// Which kernel of the family.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward = 0,
    RowDot = 1,
    KeyValue = 2,
    Query = 3,
    /// The row dot, also writing dy in f16 (for the tensor-core backward).
    RowDotCast = 4,
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

/// Keys (or queries) per tile: the most that fit two tiles of D + 4 floats per row (rows
/// padded against bank conflicts), and the tile's lse and D, in the adapter's workgroup
/// memory.
fn tile_rows(rt: &Runtime, d: usize, lanes: u32) -> Result<u32, Error> {
    let limit = rt.gpu.caps.limits.max_compute_workgroup_storage_size as usize;
    [64u32, 32, 16, 8, 4]
        .into_iter()
        .filter(|&bc| bc >= lanes)
        .find(|&bc| 2 * bc as usize * (d + 4) * 4 + 2 * bc as usize * 4 <= limit)
        .ok_or_else(|| {
            Error::invalid(
                "flash attention",
                format!("head size {d} needs more workgroup memory than the adapter's {limit} bytes"),
            )
        })
}

/// The most vec4 slices per lane whose loops over a tile are written out: beyond it the
/// code grows large. On the H100 (f32, head size 64, 2 lanes a row: 8 slices) written-out
/// loops made dQ 1.22 -> 3.46 ms and the forward 1.10 -> 1.30 ms; on lavapipe, writing
/// out every loop took the attention tests 11 minutes to compile.
pub const UNROLL_SLICES: u32 = 4;

/// A kernel of the family, its rows per tile and thread (`per`) and its rows per
/// workgroup.
struct Chosen {
    kernel: std::sync::Arc<crate::runtime::Kernel>,
    per: u32,
    br: u32,
    /// A dQ kernel that computes D = rowsum(dy * y) itself and writes it (binding y
    /// after the usual five): no row-dot kernel runs before it.
    row_dot: bool,
    /// A tensor-core kernel: qkv (and, backward, dy) bound again after the usual
    /// bindings, as the vector views its own rows are loaded through.
    views: bool,
}

/// The kernel of `mode` on `path` (the row dot has no tensor-core variant: it runs
/// plain there).
#[allow(clippy::too_many_arguments)]
fn kernel(
    rt: &Runtime,
    mode: Mode,
    tq: DType,
    td: DType,
    d: usize,
    t: usize,
    path: Path,
    tile: Option<CoopTile>,
    bindings: usize,
) -> Result<Chosen, Error> {
    require_f16(rt, &[tq, td])?;
    path.check(rt, tq, d)?;
    let coop_mode = match mode {
        Mode::Forward => Some(CoopMode::Forward),
        Mode::KeyValue => Some(CoopMode::KeyValue),
        Mode::Query => Some(CoopMode::Query),
        Mode::RowDot | Mode::RowDotCast => None,
    };
    if let (Path::Coop, Some(cm)) = (path, coop_mode) {
        let limit = u64::from(rt.gpu.caps.limits.max_compute_workgroup_storage_size);
        let too_big = || {
            Error::invalid(
                "flash attention",
                format!("head size {d} needs more workgroup memory than the adapter's {limit} bytes"),
            )
        };
        let tile = match tile {
            Some(t) if t.workgroup_bytes(cm, d as u32) > limit => return Err(too_big()),
            Some(t) if t.subgroup_sync && !rt.gpu.caps.subgroup_barrier => {
                return Err(Error::invalid(
                    "flash attention",
                    "subgroup barriers, which the adapter does not grant",
                ));
            }
            Some(t) => t,
            None => coop::pick(cm, d as u32, limit, rt.gpu.caps.subgroup_barrier).ok_or_else(too_big)?,
        };
        let whole = coop::whole(t, tile);
        let key = KernelKey::new(
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
        );
        // (the views: qkv forward; qkv and dy backward)
        let views = if cm == CoopMode::Forward { 1 } else { 2 };
        let k = rt.kernel(key, bindings + views, || coop::source(cm, td, d as u32, tile, whole))?;
        return Ok(Chosen {
            kernel: k,
            per: 0,
            br: tile.br(),
            row_dot: false,
            views: true,
        });
    }
    let d4 = (d / 4) as u32;
    let tiled_mode = match mode {
        Mode::Forward => Some(TiledMode::Forward),
        Mode::KeyValue => Some(TiledMode::KeyValue),
        Mode::Query => Some(TiledMode::Query),
        Mode::RowDot | Mode::RowDotCast => None,
    };
    if let (Path::Tiled, Some(tm)) = (path, tiled_mode) {
        let limit = u64::from(rt.gpu.caps.limits.max_compute_workgroup_storage_size);
        if let Some(tile) = tiled::pick(tm, d4, limit) {
            let chunks = tiled::chunks(rt.gpu.report.device_type == "cpu");
            let key = KernelKey::new(
                "flash_attention_tiled",
                &[
                    mode as u32,
                    tq as u32,
                    td as u32,
                    d4,
                    tile.br,
                    tile.bc,
                    tile.tm,
                    chunks | u32::from(tile.prefetch) << 8,
                ],
            );
            let row_dot = tm == TiledMode::Query;
            let bindings = bindings + usize::from(row_dot);
            let k = rt.kernel(key, bindings, || tiled::source(tm, tq, td, d4, tile, chunks))?;
            return Ok(Chosen {
                kernel: k,
                per: 0,
                br: tile.br,
                row_dot,
                views: false,
            });
        }
    }
    // The lane kernels: the row dot on every path, and the Tiled path's fallback.
    let path = match path {
        Path::Coop => Path::Plain,
        Path::Tiled if path.rows(d4, mode as u32) == 1 => Path::Subgroup,
        p => p,
    };
    let lanes = path.lanes(d4, mode as u32);
    let bc = tile_rows(rt, d, lanes)?;
    let subgroup = u32::from(matches!(path, Path::Subgroup | Path::Tiled));
    let unroll = unrolled(rt, d4, path, mode as u32);
    let key = KernelKey::new(
        "flash_attention",
        &[
            mode as u32,
            tq as u32,
            td as u32,
            d4,
            BR,
            bc,
            lanes,
            subgroup | u32::from(unroll) << 1,
        ],
    );
    let k = rt.kernel(key, bindings, || source(mode as u32, tq, td, d4, bc, path, unroll))?;
    Ok(Chosen {
        kernel: k,
        per: bc,
        br: BR,
        row_dot: false,
        views: false,
    })
}

/// The WGSL of one SIMT variant: the template rendered, its loops over a tile's rows
/// written out (`//#unroll` blocks, four rows a copy) if `unroll` (else kept as loops),
/// then each line holding `@k` repeated once per vec4 slice a lane holds (`@k` replaced
/// by 0, 1, ...).
pub fn source(mode: u32, tq: DType, td: DType, d4: u32, bc: u32, path: Path, unroll: bool) -> Result<String, Error> {
    let wgsl = render("flash_attention", SOURCE, &variant(mode, tq, td, d4, bc, path, unroll))?;
    // A thread's loads of a streamed tile: BC * D4 vec4s over the workgroup's threads.
    let threads = path.threads(d4, mode);
    let wgsl = repeat_marked(&wgsl, "@L", (bc * d4).div_ceil(threads));
    Ok(repeat_marked(&wgsl, "@k", d4 / path.lanes(d4, mode)))
}

/// Whether the SIMT kernel's loops over a tile are written out on `rt`'s adapter at head
/// size 4 `d4`: where a lane holds at most [`UNROLL_SLICES`] slices (the H100 ran the
/// f32 attention in 4.07 ms written out, against 4.18 ms as loops); on CPU adapters
/// (lavapipe), whose compilers unroll for themselves and compile big code slowly (the
/// attention tests took 4 minutes written out against 50 s), only up to 2 slices. dK dV
/// with two key rows a thread ran in 1088 us written out (255 registers) against 1157 as
/// loops (167).
pub fn unrolled(rt: &Runtime, d4: u32, path: Path, mode: u32) -> bool {
    let slices = d4 / path.lanes(d4, mode);
    slices <= if rt.gpu.report.device_type == "cpu" { 2 } else { UNROLL_SLICES }
}

/// The template values of one variant: `mode` 0 forward, 1 the row dot D, 2 dK and
/// dV, 3 dQ, 4 the row dot also writing dy in f16; `bc` rows per tile.
pub fn variant(mode: u32, tq: DType, td: DType, d4: u32, bc: u32, path: Path, unroll: bool) -> Vec<(&'static str, String)> {
    let lanes = path.lanes(d4, mode);
    let flag = |on: bool| on.to_string();
    vec![
        ("ATTENTION_COMMON", ATTENTION_COMMON.into()),
        (
            "ENABLE",
            enables(&[tq, td, if mode == Mode::RowDotCast as u32 { DType::F16 } else { tq }]),
        ),
        ("TQ", tq.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("D4", d4.to_string()),
        ("BR", BR.to_string()),
        ("BC", bc.to_string()),
        ("ROWS4", format!("{}{}", bc / 4, if unroll { "" } else { " loop" })),
        ("R", lanes.to_string()),
        ("WG", path.threads(d4, mode).to_string()),
        ("TILE", (bc * (d4 + 1)).to_string()),
        ("MODE", mode.to_string()),
        ("SUBGROUP", flag(matches!(path, Path::Subgroup | Path::Tiled))),
        ("FWD", flag(mode == Mode::Forward as u32)),
        ("PRE", flag(mode == Mode::RowDot as u32 || mode == Mode::RowDotCast as u32)),
        ("CAST", flag(mode == Mode::RowDotCast as u32)),
        ("BWD", flag(mode == Mode::KeyValue as u32 || mode == Mode::Query as u32)),
        ("BWD_KV", flag(mode == Mode::KeyValue as u32)),
        ("KV1", flag(mode == Mode::KeyValue as u32 && path.rows(d4, mode) == 1)),
        ("KV2", flag(path.rows(d4, mode) == 2)),
        ("BWD_Q", flag(mode == Mode::Query as u32)),
        ("KV_TILES", flag(mode == Mode::Forward as u32 || mode == Mode::Query as u32)),
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
pub fn forward_tiled(rt: &Runtime, qkv: &Tensor, nh: usize, path: Path, tile: Option<CoopTile>, label: &str) -> Result<FlashSaved, Error> {
    let dims = Dims::of(qkv, nh)?;
    let dt = qkv.dtype();
    check_tensor("flash attention qkv", qkv, dt)?;
    let k = kernel(rt, Mode::Forward, dt, dt, dims.d, dims.t, path, tile, 3)?;
    let y = Tensor::empty(rt, &[dims.b, dims.t, dims.c()], dt, Category::Activation, label)?;
    let lse = Tensor::empty(
        rt,
        &[dims.b, dims.nh, dims.t],
        DType::F32,
        Category::Activation,
        &format!("{label}.lse"),
    )?;
    let blocks = dims.blocks(k.br);
    // Q K^T and P V: every path makes one pass over the keys.
    let products = 4.0;
    let bound = [qkv, &y, &lse, qkv];
    rt.launch_with_work(
        &k.kernel,
        bytemuck::bytes_of(&dims.params(blocks, k.per)),
        &bound[..3 + usize::from(k.views)],
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
    pub query: Option<CoopTile>,
    /// dK dV's tile.
    pub key_value: Option<CoopTile>,
}

impl BackwardTiles {
    /// The same tile (or the pick) for both kernels.
    pub fn both(tile: Option<CoopTile>) -> BackwardTiles {
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
    // reads it.
    let dy16 = if path == Path::Coop && td == DType::F32 {
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
    // The backward kernels read dy in f16 where it is cast; the register-tiled dQ
    // computes D itself (it runs first), else the row-dot kernel runs before both.
    let td_bwd = if dy16.is_some() { DType::F16 } else { td };
    let query = kernel(rt, Mode::Query, tq, td_bwd, dims.d, dims.t, path, tiles.query, 5)?;
    let key_value = kernel(rt, Mode::KeyValue, tq, td_bwd, dims.d, dims.t, path, tiles.key_value, 5)?;
    if !query.row_dot {
        let (pre_mode, pre_bindings) = if dy16.is_some() { (Mode::RowDotCast, 4) } else { (Mode::RowDot, 3) };
        let pre = kernel(rt, pre_mode, tq, td, dims.d, dims.t, path, None, pre_bindings)?;
        // D / 4 threads a row.
        let rows_per = (BR * path.lanes((dims.d / 4) as u32, pre_mode as u32)) as usize / (dims.d / 4);
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
        let blocks = dims.blocks(k.br);
        let simt = [qkv, dy, &saved.lse, &dvec, &dqkv, &saved.y];
        let coop = [qkv, dy, &saved.lse, &dvec, &dqkv, qkv, dy];
        let bound: &[&Tensor] = if k.views { &coop } else { &simt[..5 + usize::from(k.row_dot)] };
        rt.launch_with_work(
            &k.kernel,
            bytemuck::bytes_of(&dims.params(blocks, k.per)),
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
    Ok(Path::for_inputs(rt, qkv.dtype(), dims.d))
}

/// [`forward_on`] on the path the adapter and the inputs allow.
pub fn forward(rt: &Runtime, qkv: &Tensor, nh: usize, label: &str) -> Result<FlashSaved, Error> {
    forward_on(rt, qkv, nh, path_for(rt, qkv, nh)?, label)
}

/// [`backward_on`] on the path the adapter and the inputs allow (the forward's).
pub fn backward(rt: &Runtime, qkv: &Tensor, nh: usize, saved: &FlashSaved, dy: &Tensor, label: &str) -> Result<Tensor, Error> {
    backward_on(rt, qkv, nh, saved, dy, path_for(rt, qkv, nh)?, label)
}
