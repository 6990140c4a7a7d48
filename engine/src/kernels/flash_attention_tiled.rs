//! The register-tiled SIMT attention (shaders/flash_attention_tiled.wgsl): the forward,
//! dQ and dK dV computed in f32 as small matmuls, each thread owning a block of scores
//! and a block of outputs; dQ also computes the row dot D = rowsum(dy * y) of its rows,
//! which dK dV reads, so no row-dot kernel runs. Its tiles (rows owned, rows streamed, own rows per thread)
//! are chosen per kernel by the adapter's workgroup memory; head sizes that are
//! multiples of 32 up to 128. `kernels::flash_attention` picks it (`Path::Tiled`) where
//! subgroups of at least 8 lanes are granted, for the forward and dQ (dK dV only when a
//! tile is asked for: see [`pick`]), and falls back to its lane kernels where no tile
//! fits. A tuning spec (the runtime's `KernelOverrides::attention_tiles`, `wgtrain
//! bench --attention-tiles`) forces its variants: `fwd=`, `q=`, `kv=` tiles
//! (`BRxBCxTM`, `p` for prefetch, or `off`; `kv=lane` the lane dK dV with one key row
//! a thread), `unroll` / `u1` / `u2` / `u4` (the loops), or `off` (the lane kernels
//! throughout).
//!
//! May call: `error`, `kernels::common`, `runtime`, `tensor`.

use super::common::{ATTENTION_COMMON, enables};
use crate::error::Error;
use crate::runtime::{render, repeat_marked};
use crate::tensor::DType;

const SOURCE: &str = include_str!("../../../shaders/flash_attention_tiled.wgsl");

/// The kernels of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TiledMode {
    /// y and lse; owns query rows, streams keys.
    Forward,
    /// dK and dV; owns key rows, streams queries.
    KeyValue,
    /// dQ; owns query rows, streams keys.
    Query,
}

/// A workgroup's tile: rows it owns (`br`), rows per streamed tile (`bc`), own rows per
/// thread (`tm`), and whether the next streamed tile is fetched into registers while
/// this one is computed (`prefetch`). Threads: 8 per row group, `br / tm` row groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledTile {
    /// Rows owned by a workgroup.
    pub br: u32,
    /// Rows of the other side per streamed tile.
    pub bc: u32,
    /// Own rows per thread.
    pub tm: u32,
    /// The next tile fetched while this one is computed.
    pub prefetch: bool,
}

/// Tiles tried in order, the first that fits the adapter's workgroup memory taken: the
/// largest blocks per thread that the H100's 48 KiB hold at head size 64, then ones
/// that fit 32 KiB (lavapipe) and smaller. dK dV has none: it runs on the lane kernel
/// unless a tile is asked for (`kv=32x32x2p`), since within 48 KiB a workgroup owns at
/// most 32 keys against 32 queries a tile, and on the H100 (f32, head size 64) that took
/// 1554 us against the lane kernel's 1248 (1088 with two key rows a thread).
const CANDIDATES: [(TiledMode, TiledTile); 7] = [
    (TiledMode::Forward, TiledTile::prefetched(64, 64, 4)),
    (TiledMode::Forward, TiledTile::prefetched(32, 32, 4)),
    (TiledMode::Forward, TiledTile::prefetched(16, 32, 2)),
    (TiledMode::Query, TiledTile::prefetched(64, 32, 4)),
    (TiledMode::Query, TiledTile::prefetched(32, 32, 4)),
    (TiledMode::Query, TiledTile::prefetched(16, 32, 2)),
    (TiledMode::Query, TiledTile::prefetched(8, 32, 1)),
];

/// The tiles `tests/kernel_variants.rs` validates and `examples/shader_stats` compiles
/// (each with and without prefetch): the candidates, and the ones measured against them.
pub const SWEEP: [TiledTile; 8] = [
    TiledTile::prefetched(64, 64, 4),
    TiledTile::prefetched(32, 64, 4),
    TiledTile::prefetched(64, 32, 4),
    TiledTile::prefetched(32, 32, 4),
    TiledTile::prefetched(32, 32, 2),
    TiledTile::prefetched(16, 32, 2),
    TiledTile::prefetched(8, 32, 1),
    TiledTile::prefetched(64, 64, 2),
];

impl TiledTile {
    /// A tile that fetches the next streamed tile while it computes this one.
    pub const fn prefetched(br: u32, bc: u32, tm: u32) -> TiledTile {
        TiledTile {
            br,
            bc,
            tm,
            prefetch: true,
        }
    }

    /// Threads per workgroup.
    pub fn threads(self) -> u32 {
        8 * self.br / self.tm.max(1)
    }

    /// Whether the kernel can take this tile at head size 4 `d4`: `d4` a multiple of 8
    /// up to 32 (a thread's columns are every 8th vec4, and the swizzle stays in a row),
    /// row groups a multiple of 8 (a thread's own rows share one swizzle), streamed
    /// tiles of 32, 64 or 128 rows (P's rows hold at least 8 vec4s), at most 256 threads.
    pub fn valid(self, d4: u32) -> bool {
        d4 > 0
            && d4.is_multiple_of(8)
            && d4 <= 32
            && self.tm > 0
            && self.br.is_multiple_of(self.tm)
            && (self.br / self.tm).is_multiple_of(8)
            && matches!(self.bc, 32 | 64 | 128)
            && self.threads() <= 256
            && self.threads() >= self.bc
            && (self.br * d4).is_multiple_of(self.threads())
            && (self.bc * d4).is_multiple_of(self.threads())
    }

    /// Workgroup memory of `mode` at head size 4 `d4`, in bytes.
    pub fn workgroup_bytes(self, mode: TiledMode, d4: u32) -> u64 {
        let (br, bc, d4) = (u64::from(self.br), u64::from(self.bc), u64::from(d4));
        let own = br * d4;
        let streamed = bc * d4;
        let scores = br * bc / 4;
        let vec4s = match mode {
            TiledMode::Forward => own + streamed.max(scores) + streamed,
            TiledMode::Query => 2 * own + streamed + streamed.max(scores),
            TiledMode::KeyValue => 2 * own + 2 * streamed + 2 * scores,
        };
        16 * vec4s + if mode == TiledMode::KeyValue { 8 * bc } else { 0 }
    }
}

/// The first candidate tile of `mode` that the kernel takes at head size 4 `d4` and that
/// fits `limit` bytes of workgroup memory; a tuning `spec` (e.g.
/// `fwd=64x64x4,q=32x32x4p,kv=32x32x4`, rows owned x rows streamed x own rows a thread,
/// `p` for prefetch) puts a tile of its own first; `off` takes none (the lane kernels
/// run instead).
pub fn pick(spec: &str, mode: TiledMode, d4: u32, limit: u64) -> Option<TiledTile> {
    if spec.trim() == "off" {
        return None;
    }
    let forced = match forced_tile(spec, mode) {
        SpecTile::Off => return None,
        SpecTile::Tile(t) => Some(t),
        SpecTile::None => None,
    };
    forced
        .into_iter()
        .chain(CANDIDATES.iter().filter(|(m, _)| *m == mode).map(|&(_, t)| t))
        .find(|t| t.valid(d4) && t.workgroup_bytes(mode, d4) <= limit)
}

/// How the loops over the head dimension and over a tile's rows are written: 0 written
/// out, else kept as loops taking this many chunks a turn. On GPUs loops of 2 chunks,
/// unless the tuning spec holds `unroll` (written out, on any adapter) or `u1` / `u4`;
/// on CPU adapters (lavapipe) loops of one. On the H100 (f32, head size 64, prefetch) the
/// forward (64 x 64, 4 rows a thread) took 585 us with 2 chunks a turn, 594 with 4, 612
/// with 1 and 801 written out (201, 196, 210 and 254 registers); dQ (64 x 32) 838, 831,
/// 872 and 1151.
pub fn chunks(spec: &str, cpu: bool) -> u32 {
    match () {
        _ if written_out(spec) => 0,
        _ if cpu => 1,
        _ if says(spec, "u4") => 4,
        _ if says(spec, "u2") => 2,
        _ if says(spec, "u1") => 1,
        _ => 2,
    }
}

/// Whether the tuning spec holds `unroll`: loops written out, on CPU adapters too (whose
/// plans keep them as loops otherwise).
pub fn written_out(spec: &str) -> bool {
    says(spec, "unroll")
}

/// Whether the comma-separated tuning spec holds `word` on its own.
fn says(spec: &str, word: &str) -> bool {
    spec.split(',').any(|p| p.trim() == word)
}

/// What a tuning spec says of one kernel.
enum SpecTile {
    /// Nothing.
    None,
    /// `off`: the lane kernel.
    Off,
    /// This tile first.
    Tile(TiledTile),
}

/// What `spec` says of `mode` (`fwd=BRxBCxTM[p],q=...,kv=...`, or `kv=off`).
fn forced_tile(spec: &str, mode: TiledMode) -> SpecTile {
    match spec_value(spec, mode) {
        Some("off") => SpecTile::Off,
        Some(v) => parse_tile(v).map_or(SpecTile::None, SpecTile::Tile),
        None => SpecTile::None,
    }
}

/// Whether the tuning spec holds `kv=lane`: dK dV on the lane kernel that gives each
/// thread one key row (`kernels::attention_plan::lane_rows`), for comparison with the
/// default of two.
pub fn one_key_row(spec: &str) -> bool {
    spec_value(spec, TiledMode::KeyValue) == Some("lane")
}

/// Checks a tuning spec: comma-separated `off`, `unroll`, `u1`, `u2`, `u4`,
/// `fwd=`/`q=`/`kv=` with a tile `BRxBCxTM[p]` or `off` (`kv=` also `lane`).
pub fn check_spec(spec: &str) -> Result<(), Error> {
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let ok = match part.split_once('=') {
            None => ["off", "unroll", "u1", "u2", "u4"].contains(&part),
            Some((kernel, value)) => {
                ["fwd", "q", "kv"].contains(&kernel)
                    && (value == "off" || (kernel == "kv" && value == "lane") || parse_tile(value).is_some())
            }
        };
        if !ok {
            return Err(Error::invalid(
                "attention tiles",
                format!("'{part}' (expected off, unroll, u1, u2, u4, or fwd=/q=/kv= with BRxBCxTM[p] or off; kv=lane)"),
            ));
        }
    }
    Ok(())
}

fn spec_value(spec: &str, mode: TiledMode) -> Option<&str> {
    let name = match mode {
        TiledMode::Forward => "fwd",
        TiledMode::Query => "q",
        TiledMode::KeyValue => "kv",
    };
    spec.split(',').find_map(|part| part.trim().strip_prefix(name)?.strip_prefix('='))
}

fn parse_tile(value: &str) -> Option<TiledTile> {
    let (value, prefetch) = match value.strip_suffix('p') {
        Some(v) => (v, true),
        None => (value, false),
    };
    let n: Vec<u32> = value.split('x').map(|x| x.trim().parse().ok()).collect::<Option<_>>()?;
    match n[..] {
        [br, bc, tm] => Some(TiledTile { br, bc, tm, prefetch }),
        _ => None,
    }
}

/// The WGSL of one variant: qkv of type `tq`, dy of type `td`, head size 4 `d4`; the
/// loops over the head dimension and a tile's rows written out if `chunks` is 0, else
/// kept as loops taking `chunks` chunks a turn ([`chunks`]).
pub fn source(mode: TiledMode, tq: DType, td: DType, d4: u32, tile: TiledTile, chunks: u32) -> Result<String, Error> {
    let cu = chunks.max(1);
    if !tile.valid(d4) || !d4.is_multiple_of(cu) || !(tile.bc / 4).is_multiple_of(cu) {
        return Err(Error::invalid(
            "flash attention",
            format!(
                "the register-tiled kernel cannot take tile {tile:?} at head size {} in chunks of {chunks}",
                4 * d4
            ),
        ));
    }
    let wgsl = render("flash_attention_tiled", SOURCE, &variant(mode, tq, td, d4, tile, chunks))?;
    let wgsl = repeat_marked(&wgsl, "@C", cu);
    let wgsl = repeat_marked(&wgsl, "@O", tile.br * d4 / tile.threads());
    let wgsl = repeat_marked(&wgsl, "@L", tile.bc * d4 / tile.threads());
    let wgsl = repeat_marked(&wgsl, "@I", tile.tm);
    let wgsl = repeat_marked(&wgsl, "@J", tile.bc / 8);
    Ok(repeat_marked(&wgsl, "@E", d4 / 8))
}

/// The template values of one variant.
pub fn variant(mode: TiledMode, tq: DType, td: DType, d4: u32, tile: TiledTile, chunks: u32) -> Vec<(&'static str, String)> {
    let flag = |on: bool| on.to_string();
    let (own, streamed, scores) = (tile.br * d4, tile.bc * d4, tile.br * tile.bc / 4);
    let count = |n: u32| n.checked_div(chunks).map_or_else(|| n.to_string(), |turns| format!("{turns} loop"));
    vec![
        ("ATTENTION_COMMON", ATTENTION_COMMON.into()),
        ("ENABLE", enables(&[tq, td])),
        ("TQ", tq.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("D4", d4.to_string()),
        ("BR", tile.br.to_string()),
        ("BC", tile.bc.to_string()),
        ("RG", (tile.br / tile.tm).to_string()),
        ("NT", tile.threads().to_string()),
        ("D4U", count(d4)),
        ("BC4U", count(tile.bc / 4)),
        ("CU", chunks.max(1).to_string()),
        ("OWN_B", own.to_string()),
        (
            "STR_A",
            (if mode == TiledMode::Forward {
                streamed.max(scores)
            } else {
                streamed
            })
            .to_string(),
        ),
        (
            "STR_B",
            (if mode == TiledMode::Query { streamed.max(scores) } else { streamed }).to_string(),
        ),
        ("FWD", flag(mode == TiledMode::Forward)),
        ("BWD", flag(mode != TiledMode::Forward)),
        ("BWD_Q", flag(mode == TiledMode::Query)),
        ("BWD_KV", flag(mode == TiledMode::KeyValue)),
        ("PREFETCH", flag(tile.prefetch)),
        ("FETCH_NOW", flag(!tile.prefetch)),
    ]
}
