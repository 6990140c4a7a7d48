//! The fused attention's plan: a pure function of qkv's and dy's types, the head size,
//! the sequence length, the adapter's facts and the runtime's tuning overrides that
//! chooses each kernel of the family (tensor cores, register-tiled SIMT or lane
//! kernels), its tile, loops and threads. `kernels::flash_attention` launches a plan;
//! nothing here needs a GPU, so `tests/kernel_plans.rs` checks the choices for described
//! adapters. A kernel plan's `Display` is its name in the profiler's table and trace.
//!
//! Paths: `Coop` (tensor cores, `kernels::flash_attention_coop`) for f16 qkv and head
//! sizes that are multiples of 16 where 16x16x16 f16 -> f32 and subgroups of 32 are
//! granted; otherwise `Tiled` where subgroups of at least 8 are granted (the forward and
//! dQ register-tiled, `kernels::flash_attention_tiled`, dK dV and whatever no tile fits
//! on the lane kernels, two key rows a thread at head sizes 32 and 64); otherwise
//! `Subgroup` (a row's lanes split its head dimension) where subgroups of at least 4
//! are granted, else `Plain` (a thread per row).
//!
//! May call: `device` (adapter facts), `error`,
//! `kernels::{flash_attention_coop, flash_attention_tiled}`, `tensor`.

use std::fmt;

use super::flash_attention_coop::{self as coop, AttentionTile, CoopMode};
use super::flash_attention_tiled::{self as tiled, TiledMode, TiledTile};
use crate::device::AdapterFacts;
use crate::error::Error;
use crate::tensor::DType;

/// Rows (queries, or keys in dK/dV) per workgroup of the lane kernels. On the H100
/// (f32, head size 64) 32 rows took dK dV from 1248 to 1813 us, dQ from 1037 to 1994
/// and the forward from 737 to 1421.
pub const BR: u32 = 64;

/// Largest head size.
pub const MAX_HEAD: usize = 128;

/// The most vec4 slices per lane whose loops over a tile are written out: beyond it the
/// code grows large. On the H100 (f32, head size 64, 2 lanes a row: 8 slices) written-out
/// loops made dQ 1.22 -> 3.46 ms and the forward 1.10 -> 1.30 ms; on lavapipe, writing
/// out every loop took the attention tests 11 minutes to compile.
pub const UNROLL_SLICES: u32 = 4;

/// Which kernel of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// y and lse.
    Forward = 0,
    /// D = rowsum(dy * y).
    RowDot = 1,
    /// dK and dV.
    KeyValue = 2,
    /// dQ.
    Query = 3,
    /// The row dot, also writing dy in f16 (for the tensor-core backward).
    RowDotCast = 4,
}

impl Mode {
    /// Every kernel, in the order of their numbers.
    pub const ALL: [Mode; 5] = [Mode::Forward, Mode::RowDot, Mode::KeyValue, Mode::Query, Mode::RowDotCast];
}

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
    /// Register-tiled SIMT kernels for the forward and dQ; dK dV on the lane kernel
    /// with two key rows a thread; a kernel whose tile does not fit the adapter's
    /// workgroup memory runs as on `Subgroup`.
    Tiled,
}

impl Path {
    /// The path for qkv of type `tq` and head size `d`: tensor cores where the adapter
    /// and the inputs allow, else [`Path::for_adapter`].
    pub fn for_inputs(facts: &AdapterFacts, tq: DType, d: usize) -> Path {
        if coop::eligible(facts.coop_f16, facts.subgroup_size, tq, d) {
            Path::Coop
        } else {
            Path::for_adapter(facts)
        }
    }

    /// The SIMT path the adapter allows: the register-tiled kernels where subgroups of
    /// at least 8 lanes are granted, the lane kernels where subgroups of at least 4 are.
    pub fn for_adapter(facts: &AdapterFacts) -> Path {
        if facts.subgroup && facts.subgroup_size.0 >= 8 {
            Path::Tiled
        } else if facts.subgroup && facts.subgroup_size.0 >= 4 {
            Path::Subgroup
        } else {
            Path::Plain
        }
    }
}

/// A lane kernel (shaders/flash_attention.wgsl): its path, head size 4 `d4`, mode,
/// rows a thread holds, lanes a row, rows per streamed tile, and whether its loops over
/// a tile are written out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneKernel {
    /// Plain, Subgroup or Tiled (whose lane kernel takes two key rows a thread).
    pub path: Path,
    /// Head size / 4.
    pub d4: u32,
    /// The kernel.
    pub mode: Mode,
    /// Rows a thread holds (2: dK dV with two key rows a thread).
    pub rows: u32,
    /// Threads a row.
    pub lanes: u32,
    /// Rows per streamed tile.
    pub bc: u32,
    /// Loops over a tile written out.
    pub unroll: bool,
}

impl LaneKernel {
    /// The lane kernel `mode` on `path` at head size 4 `d4` with `bc` rows a streamed
    /// tile, loops written out where `unroll`, without tuning overrides (for rendering
    /// every variant).
    pub fn new(path: Path, d4: u32, mode: Mode, bc: u32, unroll: bool) -> LaneKernel {
        let rows = lane_rows(path, d4, mode, "");
        LaneKernel {
            path,
            d4,
            mode,
            rows,
            lanes: lane_lanes(path, d4, mode, rows),
            bc,
            unroll,
        }
    }

    /// Threads a workgroup.
    pub fn threads(&self) -> u32 {
        BR / self.rows * self.lanes
    }

    /// Whether its threads use subgroup operations.
    pub fn subgroup(&self) -> bool {
        matches!(self.path, Path::Subgroup | Path::Tiled)
    }
}

/// Rows a thread of the lane kernel `mode` holds: 2 for dK dV on the tiled path at head
/// sizes 32 and 64, with 8 lanes a pair of rows, so that each vec4 read from a query
/// tile serves both rows (1 where the overrides say `kv=lane`); else 1. On the H100
/// (f32, head size 64) two rows took dK dV from 1245 to 1088 us. (dQ with two query rows
/// a thread took 885-889 us against the tiled dQ's 849, so dQ stays tiled.)
pub fn lane_rows(path: Path, d4: u32, mode: Mode, spec: &str) -> u32 {
    if path == Path::Tiled && mode == Mode::KeyValue && matches!(d4, 8 | 16) && !tiled::one_key_row(spec) {
        2
    } else {
        1
    }
}

/// Threads a row of the lane kernel `mode` at head size 4 `d4`: 8 with two rows a
/// thread; on the subgroup path 4 for dK dV and 2 for the others, or fewer where `d4`
/// does not divide by them. On the H100 at head size 64 (f32), 2 lanes ran the forward
/// in 1.10 ms and dQ in 1.22 (4 lanes: 1.24 and 1.35; 1 lane: 1.78 and 3.74) and dK dV
/// in 1.82 (4 lanes: 1.44).
pub fn lane_lanes(path: Path, d4: u32, mode: Mode, rows: u32) -> u32 {
    if rows == 2 {
        return 8;
    }
    let most = if mode == Mode::KeyValue { 4 } else { 2 };
    match path {
        Path::Subgroup | Path::Tiled if most == 4 && d4.is_multiple_of(4) => 4,
        Path::Subgroup | Path::Tiled if d4.is_multiple_of(2) => 2,
        _ => 1,
    }
}

/// The kernel of one mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Tensor cores; `whole`: T a multiple of the tile's rows (no bounds checks).
    Coop {
        /// The kernel.
        mode: CoopMode,
        /// Its tile.
        tile: AttentionTile,
        /// Whole tiles.
        whole: bool,
    },
    /// Register-tiled SIMT; loops of `chunks` chunks a turn (0 written out).
    Tiled {
        /// The kernel.
        mode: TiledMode,
        /// Its tile.
        tile: TiledTile,
        /// Loop chunks.
        chunks: u32,
    },
    /// The lane kernels.
    Lane(LaneKernel),
}

/// One kernel of an attention, planned: the mode, the types, the head size and the
/// kernel chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelPlan {
    /// The kernel of the family.
    pub mode: Mode,
    /// qkv's type.
    pub tq: DType,
    /// dy's type (backward).
    pub td: DType,
    /// Head size.
    pub d: usize,
    /// What runs.
    pub kernel: AttentionKernel,
}

impl KernelPlan {
    /// Rows (queries, or keys) a workgroup owns.
    pub fn br(&self) -> u32 {
        match self.kernel {
            AttentionKernel::Coop { tile, .. } => tile.br(),
            AttentionKernel::Tiled { tile, .. } => tile.br,
            AttentionKernel::Lane(_) => BR,
        }
    }

    /// Rows per streamed tile of a lane kernel (0 for the others: the shader's `per`).
    pub fn per(&self) -> u32 {
        match self.kernel {
            AttentionKernel::Lane(l) => l.bc,
            _ => 0,
        }
    }

    /// A dQ kernel that computes D = rowsum(dy * y) itself: no row-dot kernel runs.
    pub fn row_dot(&self) -> bool {
        matches!(
            self.kernel,
            AttentionKernel::Tiled {
                mode: TiledMode::Query,
                ..
            }
        )
    }

    /// A tensor-core kernel: qkv (and, backward, dy) bound again as vector views.
    pub fn views(&self) -> bool {
        matches!(self.kernel, AttentionKernel::Coop { .. })
    }
}

/// The plan of the kernel `mode` for qkv of type `tq`, dy of type `td`, head size `d`
/// and sequence length `t` on `path` (the caller checked that the adapter allows it),
/// with the tensor-core tile forced where `tile` is set; `spec` is the runtime's
/// register-tiled attention override (empty: none).
#[allow(clippy::too_many_arguments)]
pub fn plan_kernel(
    facts: &AdapterFacts,
    spec: &str,
    mode: Mode,
    tq: DType,
    td: DType,
    d: usize,
    t: usize,
    path: Path,
    tile: Option<AttentionTile>,
) -> Result<KernelPlan, Error> {
    let limit = facts.workgroup_bytes;
    let plan = |kernel| KernelPlan { mode, tq, td, d, kernel };
    let coop_mode = match mode {
        Mode::Forward => Some(CoopMode::Forward),
        Mode::KeyValue => Some(CoopMode::KeyValue),
        Mode::Query => Some(CoopMode::Query),
        Mode::RowDot | Mode::RowDotCast => None,
    };
    if let (Path::Coop, Some(cm)) = (path, coop_mode) {
        let too_big = || {
            Error::invalid(
                "flash attention",
                format!("head size {d} needs more workgroup memory than the adapter's {limit} bytes"),
            )
        };
        let tile = match tile {
            Some(t) if t.workgroup_bytes(cm, d as u32) > limit => return Err(too_big()),
            Some(t) if t.subgroup_sync && !facts.subgroup_barrier => {
                return Err(Error::invalid(
                    "flash attention",
                    "subgroup barriers, which the adapter does not grant",
                ));
            }
            Some(t) => t,
            None => coop::pick(cm, d as u32, limit, facts.subgroup_barrier).ok_or_else(too_big)?,
        };
        return Ok(plan(AttentionKernel::Coop {
            mode: cm,
            tile,
            whole: coop::whole(t, tile),
        }));
    }
    let d4 = (d / 4) as u32;
    let tiled_mode = match mode {
        Mode::Forward => Some(TiledMode::Forward),
        Mode::KeyValue => Some(TiledMode::KeyValue),
        Mode::Query => Some(TiledMode::Query),
        Mode::RowDot | Mode::RowDotCast => None,
    };
    if let (Path::Tiled, Some(tm)) = (path, tiled_mode) {
        if let Some(tile) = tiled::pick(spec, tm, d4, limit) {
            return Ok(plan(AttentionKernel::Tiled {
                mode: tm,
                tile,
                chunks: tiled::chunks(spec, facts.cpu),
            }));
        }
    }
    // The lane kernels: the row dot on every path, and the Tiled path's fallback.
    let path = match path {
        Path::Coop => Path::Plain,
        Path::Tiled if lane_rows(path, d4, mode, spec) == 1 => Path::Subgroup,
        p => p,
    };
    let rows = lane_rows(path, d4, mode, spec);
    let lanes = lane_lanes(path, d4, mode, rows);
    let bc = tile_rows(limit, d, lanes)?;
    // Loops written out where a lane holds at most UNROLL_SLICES slices (the H100 ran
    // the f32 attention in 4.07 ms written out, against 4.18 ms as loops); on CPU
    // adapters (lavapipe), whose compilers unroll for themselves and compile big code
    // slowly, never unless the tuning spec says `unroll` (the attention tests took 4
    // minutes written out against 50 s; at 2 slices a lane the char GPT's three kernels
    // took lavapipe 16.4 s to compile and first run written out, against 1.4 s as
    // loops, and ran no faster). dK dV with two key rows a thread ran in 1088 us written out (255
    // registers) against 1157 as loops (167).
    let unroll = d4 / lanes <= UNROLL_SLICES && (!facts.cpu || tiled::written_out(spec));
    Ok(plan(AttentionKernel::Lane(LaneKernel {
        path,
        d4,
        mode,
        rows,
        lanes,
        bc,
        unroll,
    })))
}

/// Keys (or queries) per tile: the most that fit two tiles of D + 4 floats per row (rows
/// padded against bank conflicts), and the tile's lse and D, in `limit` bytes of
/// workgroup memory.
fn tile_rows(limit: u64, d: usize, lanes: u32) -> Result<u32, Error> {
    [64u32, 32, 16, 8, 4]
        .into_iter()
        .filter(|&bc| bc >= lanes)
        .find(|&bc| (2 * bc as usize * (d + 4) * 4 + 2 * bc as usize * 4) as u64 <= limit)
        .ok_or_else(|| {
            Error::invalid(
                "flash attention",
                format!("head size {d} needs more workgroup memory than the adapter's {limit} bytes"),
            )
        })
}

/// The backward of an attention, planned: dQ, dK dV, and the row dot that runs before
/// them unless dQ computes it (`pre`); `dy16`: an f32 dy is first written in f16 (the
/// tensor-core kernels read it so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardPlan {
    /// dQ.
    pub query: KernelPlan,
    /// dK dV.
    pub key_value: KernelPlan,
    /// The row-dot kernel, where dQ does not compute D itself.
    pub pre: Option<KernelPlan>,
    /// dy cast to f16 by the row dot.
    pub dy16: bool,
}

/// The backward's plan for qkv of type `tq` and dy of type `td`, with tensor-core tiles
/// forced where `query` / `key_value` are set.
#[allow(clippy::too_many_arguments)]
pub fn plan_backward(
    facts: &AdapterFacts,
    spec: &str,
    tq: DType,
    td: DType,
    d: usize,
    t: usize,
    path: Path,
    query: Option<AttentionTile>,
    key_value: Option<AttentionTile>,
) -> Result<BackwardPlan, Error> {
    let dy16 = path == Path::Coop && td == DType::F32;
    let td_bwd = if dy16 { DType::F16 } else { td };
    let query = plan_kernel(facts, spec, Mode::Query, tq, td_bwd, d, t, path, query)?;
    let key_value = plan_kernel(facts, spec, Mode::KeyValue, tq, td_bwd, d, t, path, key_value)?;
    let pre = if query.row_dot() {
        None
    } else {
        let mode = if dy16 { Mode::RowDotCast } else { Mode::RowDot };
        Some(plan_kernel(facts, spec, mode, tq, td, d, t, path, None)?)
    };
    Ok(BackwardPlan {
        query,
        key_value,
        pre,
        dy16,
    })
}

/// `flash_attention forward f16 d64 tile128x16 coop`, as the profiler names kernels.
impl fmt::Display for KernelPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Mode::Forward => "forward",
            Mode::RowDot => "row dot",
            Mode::KeyValue => "backward dK dV",
            Mode::Query => "backward dQ",
            Mode::RowDotCast => "row dot + dy f16",
        };
        write!(f, "flash_attention {mode} {}", self.tq.wgsl())?;
        if self.mode != Mode::Forward {
            write!(f, ",dy {}", self.td.wgsl())?;
        }
        write!(f, " d{}", self.d)?;
        match self.kernel {
            AttentionKernel::Coop { tile, .. } => write!(f, " tile{}x{} coop", tile.br(), tile.bc),
            AttentionKernel::Tiled { tile, chunks, .. } => {
                write!(f, " tile{}x{} tm{}", tile.br, tile.bc, tile.tm)?;
                if chunks > 0 {
                    write!(f, " loop{chunks}")?;
                }
                write!(f, "{} tiled", if tile.prefetch { " prefetch" } else { "" })
            }
            AttentionKernel::Lane(l) => write!(
                f,
                " tile{} {}{}",
                l.bc,
                if l.subgroup() { "subgroup" } else { "plain" },
                if l.unroll { " unrolled" } else { "" }
            ),
        }
    }
}
