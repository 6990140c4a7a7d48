//! Fused causal attention on cooperative matrices (shaders/flash_attention_coop.wgsl):
//! the tensor-core variant of `kernels::flash_attention` for f16 qkv and head sizes that
//! are multiples of 16 up to 128, where the adapter grants 16x16x16 f16 -> f32 and
//! subgroups of exactly 32. This file picks the tiles (rows per workgroup and per
//! streamed tile, to fit the adapter's workgroup memory) and writes the fragment code
//! unrolled; `kernels::flash_attention` launches it.
//!
//! May call: `error`, `kernels::common`, `runtime`, `tensor`.

use std::fmt::Write;

use super::common::ATTENTION_COMMON;
use crate::error::Error;
use crate::runtime::{render, repeat_marked};
use crate::tensor::DType;

const SOURCE: &str = include_str!("../../../shaders/flash_attention_coop.wgsl");

/// The kernels of the family with a tensor-core variant (the row dot has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopMode {
    /// y and lse.
    Forward = 0,
    /// dK and dV.
    KeyValue = 2,
    /// dQ.
    Query = 3,
}

/// Rows per workgroup (16 per subgroup) and per streamed tile, and how a subgroup
/// syncs its own rows of the staging area between phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTile {
    /// Subgroups of 32 per workgroup.
    pub sg: u32,
    /// Rows per streamed tile (at least the rows per workgroup: the block's own rows are
    /// loaded through the tile's memory).
    pub bc: u32,
    /// A subgroup barrier between a subgroup's phases (else a workgroup barrier).
    pub subgroup_sync: bool,
    /// The next streamed tile is fetched into registers while the current one is used
    /// (else fetched when it is stashed).
    pub prefetch: bool,
}

impl CoopTile {
    /// Rows per workgroup.
    pub fn br(self) -> u32 {
        16 * self.sg
    }

    /// Threads per workgroup.
    pub fn threads(self) -> u32 {
        32 * self.sg
    }

    /// Its name in tuning rows and statistics, e.g. `sg4.bc64.subgroup.prefetch`.
    pub fn name(self) -> String {
        format!(
            "sg{}.bc{}.{}.{}",
            self.sg,
            self.bc,
            if self.subgroup_sync { "subgroup" } else { "workgroup" },
            if self.prefetch { "prefetch" } else { "direct" }
        )
    }

    /// Bytes of workgroup memory for head size `d` in `mode`: the two streamed tiles,
    /// the staging area, P or dS, and (dK dV) the query tile's lse and D.
    pub fn workgroup_bytes(self, mode: CoopMode, d: u32) -> u64 {
        let (br, bc) = (u64::from(self.br()), u64::from(self.bc));
        let tiles = 2 * 2 * bc * u64::from(d + 8);
        let staging = 4 * br * (bc + 8);
        let second = 2 * br * (bc + 8);
        let stats = if mode == CoopMode::KeyValue { 8 * bc } else { 0 };
        tiles + staging + second + stats
    }
}

/// The tiles tried, best first.
const TILES: [(u32, u32); 5] = [(4, 64), (2, 64), (2, 32), (1, 32), (1, 16)];

/// The rule for the tensor-core variant, apart from the adapter (tested on every
/// machine): cooperative 16x16x16 f16 -> f32, subgroups of exactly 32, f16 qkv, head
/// size a multiple of 16 up to 128.
pub fn eligible(coop_f16: bool, subgroup_size: (u32, u32), tq: DType, d: usize) -> bool {
    coop_f16 && subgroup_size == (32, 32) && tq == DType::F16 && d.is_multiple_of(16) && d <= 128
}

/// The largest tile of `mode` for head size `d` within `limit` bytes of workgroup memory,
/// syncing with subgroup barriers where `subgroup_barrier` (the adapter grants them). The
/// forward fetches the next tile ahead; the backward kernels, whose tiles hold twice the
/// operands, fetch each tile when they stash it: with vector workgroup tiles that is
/// faster on the H100 (`wgtrain bench --tune --filter tune.flash`, [8, 12, 1024, 64]:
/// forward 284.6 us ahead against 317.4; forward + backward 1130.1 us with no kernel
/// fetching ahead against 1222.6 with all three, 1102 us as picked; docs/benchmarks.md).
pub fn pick(mode: CoopMode, d: u32, limit: u64, subgroup_barrier: bool) -> Option<CoopTile> {
    let ahead = mode == CoopMode::Forward;
    candidates(subgroup_barrier)
        .filter(|t| t.prefetch == ahead)
        .find(|t| t.workgroup_bytes(mode, d) <= limit)
}

/// Every tile, best first: what [`pick`] chooses from and `wgtrain bench --tune` measures.
pub fn candidates(subgroup_barrier: bool) -> impl Iterator<Item = CoopTile> {
    TILES.into_iter().flat_map(move |(sg, bc)| {
        [true, false].map(|prefetch| CoopTile {
            sg,
            bc,
            subgroup_sync: subgroup_barrier,
            prefetch,
        })
    })
}

/// `n` accumulators named `name_0..`, zeroed.
fn declare(name: &str, n: u32) -> String {
    (0..n).fold(String::new(), |mut s, j| {
        let _ = writeln!(s, "    var {name}_{j} = coop_mat16x16<f32, C>();");
        s
    })
}

/// The subgroup's own rows of `tile` [rows][D] as A fragments `name_0..` (D / 16).
fn own(name: &str, tile: &str, d: u32) -> String {
    (0..d / 16).fold(String::new(), |mut s, k| {
        let _ = writeln!(
            s,
            "    let {name}_{k} = coopLoadT<coop_mat16x16<f16, A>>(&{tile}[m0 * LD4 + {}u], LD4);",
            4 * k
        );
        s
    })
}

/// (Workgroup arrays hold vec4s: indices and strides below are in vec4s.)
///
/// Scores: the subgroup's own fragments `a_0..` (16 rows x D) times the tile `b`
/// [BC][D] read transposed, stored to the subgroup's rows of the staging area: BC / 16
/// fragments over K = D, unrolled.
fn scores(a: &str, b: &str, d: u32, bc: u32) -> String {
    let mut s = String::from("        {\n");
    s += &declare("s", bc / 16).replace("    var", "            var");
    for k in 0..d / 16 {
        for j in 0..bc / 16 {
            let _ = writeln!(
                s,
                "            s_{j} = coopMultiplyAdd({a}_{k}, coopLoad<coop_mat16x16<f16, B>>(&{b}[{}u * LD4 + {}u], LD4), s_{j});",
                16 * j,
                4 * k
            );
        }
    }
    for j in 0..bc / 16 {
        let _ = writeln!(s, "            coopStoreT(s_{j}, &stg[m0 * SLD4 + {}u], SLD4);", 4 * j);
    }
    s + "        }"
}

/// Accumulators `acc_j` += the subgroup's 16 rows of `p_t` [rows][BC] times `b` [BC][D]:
/// D / 16 fragments over K = BC.
fn accumulate(acc: &str, b: &str, d: u32) -> String {
    let mut s = String::from("        for (var kk = 0u; kk < BC; kk += 16u) {\n");
    s += "            let fa = coopLoadT<coop_mat16x16<f16, A>>(&p_t[m0 * PLD4 + kk / 4u], PLD4);\n";
    for j in 0..d / 16 {
        let _ = writeln!(
            s,
            "            {acc}_{j} = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&{b}[kk * LD4 + {}u], LD4), {acc}_{j});",
            4 * j
        );
    }
    s + "        }"
}

/// The forward's lane-held O: `o_u`, the lane's columns 4 (half + 2 u) .. + 3 of its
/// row, u < D / 8.
fn declare_o(d: u32) -> String {
    (0..d / 8).fold(String::new(), |mut s, u| {
        let _ = writeln!(s, "    var o_{u} = vec4<f32>();");
        s
    })
}

/// The forward's P V for one key tile: the subgroup's 16 rows of `p_t` times V (`y_t`)
/// into fresh fragments, staged BC columns at a time, and each lane's columns of O
/// rescaled by `alpha` and added.
fn forward_pv(d: u32, bc: u32) -> String {
    let mut s = declare("pv", d / 16).replace("    var", "        var");
    s += "        for (var kk = 0u; kk < BC; kk += 16u) {\n";
    s += "            let fa = coopLoadT<coop_mat16x16<f16, A>>(&p_t[m0 * PLD4 + kk / 4u], PLD4);\n";
    for j in 0..d / 16 {
        let _ = writeln!(
            s,
            "            pv_{j} = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&y_t[kk * LD4 + {}u], LD4), pv_{j});",
            4 * j
        );
    }
    s += "        }\n";
    // The staging area's rows hold BC columns: D / BC chunks of BC / 16 fragments.
    let per = bc.min(d) / 16;
    for chunk in 0..(d / 16).div_ceil(per) {
        let (j0, j1) = (chunk * per, ((chunk + 1) * per).min(d / 16));
        for j in j0..j1 {
            let _ = writeln!(s, "        coopStoreT(pv_{j}, &stg[m0 * SLD4 + {}u], SLD4);", 4 * (j - j0));
        }
        s += "        row_sync();\n";
        // The lane's u-th vec4 is column 4 (half + 2 u): in this chunk for 16 j0 <= 8 u < 16 j1.
        for u in 2 * j0..2 * j1 {
            let _ = writeln!(
                s,
                "        o_{u} = o_{u} * alpha + staged4(sat + 4u * (half + {}u) - {}u);",
                2 * u,
                16 * j0
            );
        }
        s += "        row_sync();\n";
    }
    s
}

/// The forward's y = O / l from the lanes' registers (rows inside T).
fn store_y(d: u32) -> String {
    let mut s = String::from("    if row < p.t {\n");
    for u in 0..d / 8 {
        let _ = writeln!(s, "        y[y_at(b, row, h) + half + {}u] = vec4<f16>(o_{u} * inv);", 2 * u);
    }
    s + "    }\n"
}

/// Stores accumulators `acc_j` through the subgroup's rows of the staging area with
/// `write` (a call taking the fragment's first column as `COL`).
fn store(acc: &str, d: u32, write: &str) -> String {
    (0..d / 16).fold(String::new(), |mut s, j| {
        let _ = writeln!(s, "    coopStoreT({acc}_{j}, &stg[m0 * SLD4], SLD4);");
        s += "    row_sync();\n";
        let _ = writeln!(s, "    {};", write.replace("COL", &format!("{}u", 16 * j)));
        s += "    row_sync();\n";
        s
    })
}

/// Whether a sequence of `t` rows is whole for `tile` (a multiple of its rows per
/// workgroup and per streamed tile): then its variant loads without bounds checks.
pub fn whole(t: usize, tile: CoopTile) -> bool {
    t > 0 && t.is_multiple_of(tile.br() as usize) && t.is_multiple_of(tile.bc as usize)
}

/// The template values of one variant: `td` is dy's type (ignored by the forward);
/// `whole` as [`whole`] says.
pub fn variant(mode: CoopMode, td: DType, d: u32, tile: CoopTile, whole: bool) -> Vec<(&'static str, String)> {
    let bc = tile.bc;
    let flag = |on: bool| on.to_string();
    let dq = "write_dqkv(lane, b, h, row0, m0, 0u, COL, p.scale)";
    let dk = "write_dqkv(lane, b, h, row0, m0, 1u, COL, p.scale)";
    let dv = "write_dqkv(lane, b, h, row0, m0, 2u, COL, 1.0)";
    // (own fragments, scores with x, scores with y, accumulators, first and second
    // accumulation, stores, streamed parts, own parts)
    let (own_code, sx, sy, decl, first, second, stores, (px, py), (ox, oy)) = match mode {
        CoopMode::Forward => (
            own("q", "x_t", d),
            scores("q", "x_t", d, bc),
            String::new(),
            declare_o(d),
            forward_pv(d, bc),
            String::new(),
            store_y(d),
            (1, 2),
            (0, 0),
        ),
        CoopMode::Query => (
            own("q", "x_t", d) + &own("g", "y_t", d),
            scores("q", "x_t", d, bc),
            scores("g", "y_t", d, bc),
            declare("dq", d / 16),
            accumulate("dq", "x_t", d),
            String::new(),
            store("dq", d, dq),
            (1, 2),
            (0, 0),
        ),
        CoopMode::KeyValue => (
            own("k", "x_t", d) + &own("v", "y_t", d),
            scores("k", "x_t", d, bc),
            scores("v", "y_t", d, bc),
            declare("dk", d / 16) + &declare("dv", d / 16),
            accumulate("dk", "x_t", d),
            accumulate("dv", "y_t", d),
            store("dk", d, dk) + &store("dv", d, dv),
            (0, 0),
            (1, 2),
        ),
    };
    vec![
        ("ATTENTION_COMMON", ATTENTION_COMMON.into()),
        ("TD", td.wgsl().to_string()),
        ("TY", if mode == CoopMode::KeyValue { "G8" } else { "H8" }.to_string()),
        ("D", d.to_string()),
        ("SG", tile.sg.to_string()),
        ("BC", bc.to_string()),
        ("COLS4", (bc / 8).to_string()),
        ("WG", tile.threads().to_string()),
        ("FWD", flag(mode == CoopMode::Forward)),
        ("BWD", flag(mode != CoopMode::Forward)),
        ("BWD_KV", flag(mode == CoopMode::KeyValue)),
        ("BWD_Q", flag(mode == CoopMode::Query)),
        ("PX", px.to_string()),
        ("PY", py.to_string()),
        ("OWN_X", ox.to_string()),
        ("OWN_Y", oy.to_string()),
        ("PREFETCH", flag(tile.prefetch)),
        ("WHOLE", flag(whole)),
        (
            "ROW_SYNC",
            if tile.subgroup_sync {
                "subgroupBarrier"
            } else {
                "workgroupBarrier"
            }
            .to_string(),
        ),
        ("OWN", own_code),
        ("SCORES_X", sx),
        ("SCORES_Y", sy),
        ("ACC_DECL", decl),
        ("ACC_FIRST", first),
        ("ACC_SECOND", second),
        ("STORE", stores),
    ]
}

/// The WGSL of one variant: rendered (the loops over a lane's columns written out, four
/// columns a copy), then the fetch lines repeated once per 8-element load a thread makes
/// of each streamed tile.
pub fn source(mode: CoopMode, td: DType, d: u32, tile: CoopTile, whole: bool) -> Result<String, Error> {
    let loads = (tile.bc * d / 8).div_ceil(tile.threads());
    let wgsl = render("flash_attention_coop", SOURCE, &variant(mode, td, d, tile, whole))?;
    Ok(repeat_marked(&wgsl, "@l", loads))
}
