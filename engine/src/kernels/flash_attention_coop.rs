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
pub struct AttentionTile {
    /// Subgroups of 32 per workgroup.
    pub sg: u32,
    /// Rows per streamed tile (fewer than the rows per workgroup is allowed: see `own`).
    pub bc: u32,
    /// A subgroup barrier between a subgroup's phases (else a workgroup barrier).
    pub subgroup_sync: bool,
    /// The next streamed tile is fetched into registers while the current one is used
    /// (else fetched when it is stashed).
    pub prefetch: bool,
}

impl AttentionTile {
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

    /// 16-byte loads of each streamed operand a thread makes per tile at head size `d`.
    pub fn loads(self, d: u32) -> u32 {
        (self.bc * d / 8).div_ceil(self.threads())
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

/// The tiles tried, best first. The NVIDIA driver gives workgroups 64 KiB of each SM's
/// memory (`examples/occupancy_probe`: one workgroup of 32 KiB or more per SM, two of
/// 24 KiB, three of 16 KiB), so the small tiles that let several workgroups share an SM
/// come first: at [8, 12, 1024, 64] on the H100, 4 x 16 against 4 x 64 (all three
/// kernels forced, fetching ahead) took the forward from 228.9 to 136.3 us and forward +
/// backward from 827.8 to 541.3 us (CHANGELOG.md).
const TILES: [(u32, u32); 9] = [(4, 16), (2, 16), (4, 32), (2, 32), (1, 16), (4, 64), (2, 64), (1, 32), (8, 16)];

/// The rule for the tensor-core variant, apart from the adapter (tested on every
/// machine): cooperative 16x16x16 f16 -> f32, subgroups of exactly 32, f16 qkv, head
/// size a multiple of 16 up to 128.
pub fn eligible(coop_f16: bool, subgroup_size: (u32, u32), tq: DType, d: usize) -> bool {
    coop_f16 && subgroup_size == (32, 32) && tq == DType::F16 && d.is_multiple_of(16) && d <= 128
}

/// The first tile of `mode` for head size `d` within `limit` bytes of workgroup memory,
/// syncing with subgroup barriers where `subgroup_barrier` (the adapter grants them).
/// The forward and dQ fetch the next tile ahead; dK dV, which holds four accumulators
/// and the most registers, fetches each tile when it stashes it (`wgtrain bench --tune
/// --filter tune.flash`, [8, 12, 1024, 64], 4 x 16 tiles: forward 136.3 us ahead against
/// 164.2; forward + backward with the other backward kernel picked: dQ ahead 527.9 us
/// against 561.6, dK dV direct 527.7 against 542.0; CHANGELOG.md). A tile whose
/// threads would hold more than four 16-byte loads of each operand ahead fetches when it
/// stashes.
///
/// The forward tries [`FORWARD_FIRST`] before the list.
pub fn pick(mode: CoopMode, d: u32, limit: u64, subgroup_barrier: bool) -> Option<AttentionTile> {
    let ahead = |t: &AttentionTile| mode != CoopMode::KeyValue && t.loads(d) <= 4;
    candidates(subgroup_barrier)
        .filter(|t| mode == CoopMode::Forward && (t.sg, t.bc) == FORWARD_FIRST)
        .chain(candidates(subgroup_barrier))
        .filter(|t| t.prefetch == ahead(t))
        .find(|t| t.workgroup_bytes(mode, d) <= limit)
}

/// The forward's first tile: 8 subgroups x 16 streamed rows (23 KiB, two workgroups of
/// 256 threads per SM at 128 registers) took the forward from 136.2 to 132.3 us at
/// [8, 12, 1024, 64], and was slower than 4 x 16 in both backward kernels (dQ 531.9
/// against 525.7 us, dK dV 599.9 against 539.9, fetching ahead; CHANGELOG.md).
const FORWARD_FIRST: (u32, u32) = (8, 16);

/// Every tile, best first: what [`pick`] chooses from and `wgtrain bench --tune` measures.
pub fn candidates(subgroup_barrier: bool) -> impl Iterator<Item = AttentionTile> {
    TILES.into_iter().flat_map(move |(sg, bc)| {
        [true, false].map(|prefetch| AttentionTile {
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

/// An operand a subgroup owns 16 rows of: its fragments' name, the workgroup tile its
/// rows pass through, and where they are in global memory (a vector view and the vec4
/// index of the subgroup's first row, then the row stride in vec4s).
struct Own {
    name: &'static str,
    tile: &'static str,
    at: String,
    stride: &'static str,
}

/// Q, K or V (qkv part 0, 1 or 2).
fn own_part(name: &'static str, tile: &'static str, part: u32) -> Own {
    Own {
        name,
        tile,
        at: format!("qkv4[qkv_at(b, row0 + m0, {part}u, h)"),
        stride: "3u * p.c4",
    }
}

/// dY.
fn own_dy(name: &'static str, tile: &'static str) -> Own {
    Own {
        name,
        tile,
        at: "dy4[y_at(b, row0 + m0, h)".into(),
        stride: "p.c4",
    }
}

/// Each subgroup's 16 own rows as A fragments `name_0..` (D / 16 each).
/// - `whole` (every row of every block inside T): straight from global memory, through
///   the vector views of qkv and dy.
/// - Else through `x_t` and `y_t` (zeros past T): in one pass where the streamed tiles
///   hold the whole block (BC >= BR), else in BR / BC passes of BC rows, where every
///   subgroup loads fragments in every pass (cooperative loads need uniform control
///   flow) and keeps those of the pass holding its rows.
fn own(ops: &[Own], d: u32, br: u32, bc: u32, whole: bool) -> String {
    let mut s = String::new();
    // One line per operand and fragment k: `{indent}{decl}name_k = coopLoadT(&{from}...)`,
    // `from(op)` giving the array and the row's vec4 index, then the stride.
    let load = |s: &mut String, indent: &str, decl: &str, from: &dyn Fn(&Own) -> (String, &str)| {
        for op in ops {
            let (at, stride) = from(op);
            for k in 0..d / 16 {
                let _ = writeln!(
                    s,
                    "{indent}{decl}{}_{k} = coopLoadT<coop_mat16x16<f16, A>>(&{at} + {}u], {stride});",
                    op.name,
                    4 * k
                );
            }
        }
    };
    if whole {
        load(&mut s, "    ", "let ", &|op| (op.at.clone(), op.stride));
        return s;
    }
    if bc >= br {
        s += "    load_own(lid, b, h, row0);\n    workgroupBarrier();\n";
        load(&mut s, "    ", "let ", &|op| (format!("{}[m0 * LD4", op.tile), "LD4"));
        return s;
    }
    for op in ops {
        for k in 0..d / 16 {
            let _ = writeln!(s, "    var {}_{k} = coop_mat16x16<f16, A>();", op.name);
        }
    }
    for pass in 0..br / bc {
        let _ = writeln!(
            s,
            "    load_own(lid, b, h, row0 + {}u);\n    workgroupBarrier();\n    {{",
            pass * bc
        );
        load(&mut s, "        ", "let fresh_", &|op| {
            (format!("{}[(m0 % BC) * LD4", op.tile), "LD4")
        });
        let _ = writeln!(s, "        if m0 / BC == {pass}u {{");
        for op in ops {
            for k in 0..d / 16 {
                let _ = writeln!(s, "            {0}_{k} = fresh_{0}_{k};", op.name);
            }
        }
        s += "        }\n    }\n    workgroupBarrier();\n";
    }
    s
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
/// D / 16 fragments over K = BC, written out.
fn accumulate(acc: &str, b: &str, d: u32, bc: u32) -> String {
    let mut s = String::from("        {\n");
    for kk in (0..bc).step_by(16) {
        let _ = writeln!(
            s,
            "            let fa_{kk} = coopLoadT<coop_mat16x16<f16, A>>(&p_t[m0 * PLD4 + {}u], PLD4);",
            kk / 4
        );
        for j in 0..d / 16 {
            let _ = writeln!(
                s,
                "            {acc}_{j} = coopMultiplyAdd(fa_{kk}, coopLoadT<coop_mat16x16<f16, B>>(&{b}[{}u * LD4 + {}u], LD4), {acc}_{j});",
                kk,
                4 * j
            );
        }
    }
    s + "        }"
}

/// Runs `each` over the fragments of a D-column accumulator in chunks that the staging
/// area's BC columns hold: `each(j0, j1)` for fragments j0..j1, the chunk staged at
/// columns 0.. of the subgroup's rows.
fn chunked(d: u32, bc: u32, mut each: impl FnMut(u32, u32) -> String) -> String {
    let per = bc.min(d) / 16;
    (0..(d / 16).div_ceil(per))
        .map(|chunk| each(chunk * per, ((chunk + 1) * per).min(d / 16)))
        .collect()
}

/// The forward's rare rescale of the accumulators `o_j` by each row's `alpha` (where the
/// row's reference max moved): through the staging area, chunk by chunk, each lane
/// scaling its columns 4 (half + 2 u) of its row.
fn rescale_o(d: u32, bc: u32) -> String {
    chunked(d, bc, |j0, j1| {
        let mut s = String::from("            row_sync();\n");
        for j in j0..j1 {
            let _ = writeln!(s, "            coopStoreT(o_{j}, &stg[m0 * SLD4 + {}u], SLD4);", 4 * (j - j0));
        }
        s += "            row_sync();\n";
        for u in 0..2 * (j1 - j0) {
            let _ = writeln!(s, "            stg[(sat + 4u * (half + {}u)) / 4u] *= alpha;", 2 * u);
        }
        s += "            row_sync();\n";
        for j in j0..j1 {
            let _ = writeln!(
                s,
                "            o_{j} = coopLoadT<coop_mat16x16<f32, C>>(&stg[m0 * SLD4 + {}u], SLD4);",
                4 * (j - j0)
            );
        }
        s
    })
}

/// The forward's y = O / l: the accumulators staged chunk by chunk, each lane writing
/// its columns of its row (rows inside T).
fn store_y(d: u32, bc: u32) -> String {
    chunked(d, bc, |j0, j1| {
        let mut s = String::new();
        for j in j0..j1 {
            let _ = writeln!(s, "    coopStoreT(o_{j}, &stg[m0 * SLD4 + {}u], SLD4);", 4 * (j - j0));
        }
        s += "    row_sync();\n    if row < p.t {\n";
        for u in 0..2 * (j1 - j0) {
            let _ = writeln!(
                s,
                "        y[y_at(b, row, h) + half + {}u] = vec4<f16>(staged4(sat + 4u * (half + {}u)) * inv);",
                2 * u + 4 * j0,
                2 * u
            );
        }
        s + "    }\n    row_sync();\n"
    })
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
/// workgroup and per streamed tile): then its variant loads without bounds checks, and
/// its subgroups load their own rows straight from global memory.
pub fn whole(t: usize, tile: AttentionTile) -> bool {
    t > 0 && t.is_multiple_of(tile.br() as usize) && t.is_multiple_of(tile.bc as usize)
}

/// The template values of one variant: `td` is dy's type (ignored by the forward);
/// `whole` as [`whole`] says.
pub fn variant(mode: CoopMode, td: DType, d: u32, tile: AttentionTile, whole: bool) -> Vec<(&'static str, String)> {
    let (br, bc) = (tile.br(), tile.bc);
    let flag = |on: bool| on.to_string();
    let dq = "write_dqkv(lane, b, h, row0, m0, 0u, COL, p.scale)";
    let dk = "write_dqkv(lane, b, h, row0, m0, 1u, COL, p.scale)";
    let dv = "write_dqkv(lane, b, h, row0, m0, 2u, COL, 1.0)";
    // (own fragments, scores with x, scores with y, accumulators, first and second
    // accumulation, stores, streamed parts, own parts)
    let (own_code, sx, sy, decl, first, second, stores, (px, py), (ox, oy)) = match mode {
        CoopMode::Forward => (
            own(&[own_part("q", "x_t", 0)], d, br, bc, whole),
            scores("q", "x_t", d, bc),
            String::new(),
            declare("o", d / 16),
            accumulate("o", "y_t", d, bc),
            String::new(),
            store_y(d, bc),
            (1, 2),
            (0, 0),
        ),
        CoopMode::Query => (
            own(&[own_part("q", "x_t", 0), own_dy("g", "y_t")], d, br, bc, whole),
            scores("q", "x_t", d, bc),
            scores("g", "y_t", d, bc),
            declare("dq", d / 16),
            accumulate("dq", "x_t", d, bc),
            String::new(),
            store("dq", d, dq),
            (1, 2),
            (0, 0),
        ),
        CoopMode::KeyValue => (
            own(&[own_part("k", "x_t", 1), own_part("v", "y_t", 2)], d, br, bc, whole),
            scores("k", "x_t", d, bc),
            scores("v", "y_t", d, bc),
            declare("dk", d / 16) + &declare("dv", d / 16),
            accumulate("dk", "x_t", d, bc),
            accumulate("dv", "y_t", d, bc),
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
        (
            "ANY_MOVED",
            // (bitwise: naga lowers a short-circuit `||` to a branch, which is not uniform)
            format!(
                "({}) != 0u",
                (0..tile.sg).map(|i| format!("flags[{i}]")).collect::<Vec<_>>().join(" | ")
            ),
        ),
        (
            "RESCALE",
            if mode == CoopMode::Forward {
                rescale_o(d, bc)
            } else {
                String::new()
            },
        ),
        ("ACC_DECL", decl),
        ("ACC_FIRST", first),
        ("ACC_SECOND", second),
        ("STORE", stores),
    ]
}

/// The WGSL of one variant: rendered (the loops over a lane's columns written out, four
/// columns a copy), then the fetch lines repeated once per 8-element load a thread makes
/// of each streamed tile.
pub fn source(mode: CoopMode, td: DType, d: u32, tile: AttentionTile, whole: bool) -> Result<String, Error> {
    let loads = tile.loads(d);
    let wgsl = render("flash_attention_coop", SOURCE, &variant(mode, td, d, tile, whole))?;
    Ok(repeat_marked(&wgsl, "@l", loads))
}
