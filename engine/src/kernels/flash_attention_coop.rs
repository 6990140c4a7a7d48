//! Fused causal attention on cooperative matrices (shaders/flash_attention_coop.wgsl):
//! the tensor-core variant of `kernels::flash_attention` for f16 qkv and head sizes that
//! are multiples of 16 up to 128, where the adapter grants 16x16x16 f16 -> f32 and
//! subgroups of exactly 32. This file picks the tiles (rows per workgroup and per
//! streamed tile, to fit the adapter's workgroup memory) and writes the fragment code
//! unrolled; `kernels::flash_attention` launches it.
//!
//! May call: `error`, `runtime`, `tensor`.

use std::fmt::Write;

use crate::error::Error;
use crate::runtime::render;
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

/// Rows per workgroup (16 per subgroup) and per streamed tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTile {
    /// Subgroups of 32 per workgroup.
    pub sg: u32,
    /// Rows per streamed tile.
    pub bc: u32,
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

    /// The rows of the (Q, dY) tiles and of the (K, V) tiles in `mode`.
    fn rows(self, mode: CoopMode) -> (u32, u32) {
        match mode {
            CoopMode::Forward | CoopMode::Query => (self.br(), self.bc),
            CoopMode::KeyValue => (self.bc, self.br()),
        }
    }

    /// Bytes of workgroup memory for head size `d` in `mode`.
    pub fn workgroup_bytes(self, mode: CoopMode, d: u32) -> u64 {
        let (q, k) = self.rows(mode);
        let ld = u64::from(d + 8);
        let q_tiles = if mode == CoopMode::Forward { 1 } else { 2 };
        let f16_tiles = 2 * ld * (q_tiles * u64::from(q) + 2 * u64::from(k));
        let staging = 4 * u64::from(self.br() * (self.bc + 4));
        let second = 2 * u64::from(self.br() * (self.bc + 8));
        let stats = if mode == CoopMode::KeyValue { 8 * u64::from(self.bc) } else { 0 };
        f16_tiles + staging + second + stats
    }
}

/// The tiles tried, best first.
const TILES: [CoopTile; 5] = [
    CoopTile { sg: 4, bc: 64 },
    CoopTile { sg: 4, bc: 32 },
    CoopTile { sg: 2, bc: 32 },
    CoopTile { sg: 2, bc: 16 },
    CoopTile { sg: 1, bc: 16 },
];

/// The rule for the tensor-core variant, apart from the adapter (tested on every
/// machine): cooperative 16x16x16 f16 -> f32, subgroups of exactly 32, f16 qkv, head
/// size a multiple of 16 up to 128.
pub fn eligible(coop_f16: bool, subgroup_size: (u32, u32), tq: DType, d: usize) -> bool {
    coop_f16 && subgroup_size == (32, 32) && tq == DType::F16 && d.is_multiple_of(16) && d <= 128
}

/// The largest tile of `mode` for head size `d` within `limit` bytes of workgroup memory.
pub fn pick(mode: CoopMode, d: u32, limit: u64) -> Option<CoopTile> {
    TILES.into_iter().find(|t| t.workgroup_bytes(mode, d) <= limit)
}

/// `n` accumulators named `name_0..`, zeroed.
fn declare(name: &str, n: u32) -> String {
    (0..n).fold(String::new(), |mut s, j| {
        let _ = writeln!(s, "    var {name}_{j} = coop_mat16x16<f32, C>();");
        s
    })
}

/// A product whose B is a tile `b` stored [BC][D] read transposed (scores: the
/// subgroup's 16 rows of `a` [rows][D] times `b`ᵀ), stored to the subgroup's rows of the
/// staging area: BC / 16 fragments over K = D.
fn scores(a: &str, b: &str, bc: u32) -> String {
    let mut s = String::from("        {\n");
    s += &declare("s", bc / 16).replace("    var", "            var");
    s += "            for (var kk = 0u; kk < D; kk += 16u) {\n";
    let _ = writeln!(
        s,
        "                let fa = coopLoadT<coop_mat16x16<f16, A>>(&{a}[m0 * LD + kk], LD);"
    );
    for j in 0..bc / 16 {
        let _ = writeln!(
            s,
            "                s_{j} = coopMultiplyAdd(fa, coopLoad<coop_mat16x16<f16, B>>(&{b}[{}u * LD + kk], LD), s_{j});",
            16 * j
        );
    }
    s += "            }\n";
    for j in 0..bc / 16 {
        let _ = writeln!(s, "            coopStoreT(s_{j}, &stg[m0 * SLD + {}u], SLD);", 16 * j);
    }
    s + "        }"
}

/// Accumulators `acc_j` += the subgroup's 16 rows of `p_t` [rows][BC] times `b` [BC][D]:
/// D / 16 fragments over K = BC.
fn accumulate(acc: &str, b: &str, d: u32) -> String {
    let mut s = String::from("        for (var kk = 0u; kk < BC; kk += 16u) {\n");
    s += "            let fa = coopLoadT<coop_mat16x16<f16, A>>(&p_t[m0 * PLD + kk], PLD);\n";
    for j in 0..d / 16 {
        let _ = writeln!(
            s,
            "            {acc}_{j} = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&{b}[kk * LD + {}u], LD), {acc}_{j});",
            16 * j
        );
    }
    s + "        }"
}

/// Stores accumulators `acc_j` through the staging area with `write` (a call taking
/// the fragment's first column as `COL`). Every subgroup runs it (it holds barriers).
fn store(acc: &str, d: u32, write: &str) -> String {
    (0..d / 16).fold(String::new(), |mut s, j| {
        let _ = writeln!(s, "    coopStoreT({acc}_{j}, &stg[m0 * SLD], SLD);");
        s += "    workgroupBarrier();\n";
        let _ = writeln!(s, "    {};", write.replace("COL", &format!("{}u", 16 * j)));
        s += "    workgroupBarrier();\n";
        s
    })
}

/// The template values of one variant: `td` is dy's type (ignored by the forward).
pub fn variant(mode: CoopMode, td: DType, d: u32, tile: CoopTile) -> Vec<(&'static str, String)> {
    let (q, k) = tile.rows(mode);
    let ld = d + 8;
    let flag = |on: bool| on.to_string();
    let mut v = vec![
        ("TD", td.wgsl().to_string()),
        ("D", d.to_string()),
        ("SG", tile.sg.to_string()),
        ("BC", tile.bc.to_string()),
        ("WG", tile.threads().to_string()),
        ("Q_LEN", (q * ld).to_string()),
        ("K_LEN", (k * ld).to_string()),
        ("FWD", flag(mode == CoopMode::Forward)),
        ("BWD", flag(mode != CoopMode::Forward)),
        ("BWD_KV", flag(mode == CoopMode::KeyValue)),
        ("BWD_Q", flag(mode == CoopMode::Query)),
    ];
    let bc = tile.bc;
    let none = String::new;
    let (qk, gv, kq, vg) = match mode {
        CoopMode::Forward | CoopMode::Query => (scores("q_t", "k_t", bc), scores("g_t", "v_t", bc), none(), none()),
        CoopMode::KeyValue => (none(), none(), scores("k_t", "q_t", bc), scores("v_t", "g_t", bc)),
    };
    v.extend([("SCORES_QK", qk), ("SCORES_GV", gv), ("SCORES_KQ", kq), ("SCORES_VG", vg)]);
    let mut code = |key: &'static str, on: bool, text: String| v.push((key, if on { text } else { none() }));
    let fwd = mode == CoopMode::Forward;
    let q = mode == CoopMode::Query;
    let kv = mode == CoopMode::KeyValue;
    code("O_DECL", fwd, declare("o", d / 16));
    code("ACC_O", fwd, accumulate("o", "v_t", d));
    code("STORE_O", fwd, store("o", d, "write_y(lane, b, h, row0, m0, COL)"));
    code("DQ_DECL", q, declare("dq", d / 16));
    code("ACC_DQ", q, accumulate("dq", "k_t", d));
    code("STORE_DQ", q, store("dq", d, "write_dqkv(lane, b, h, row0, m0, 0u, COL, p.scale)"));
    code("DKV_DECL", kv, declare("dk", d / 16) + &declare("dv", d / 16));
    code("ACC_DV", kv, accumulate("dv", "g_t", d));
    code("ACC_DK", kv, accumulate("dk", "q_t", d));
    code(
        "STORE_DKV",
        kv,
        store("dk", d, "write_dqkv(lane, b, h, row0, m0, 1u, COL, p.scale)")
            + &store("dv", d, "write_dqkv(lane, b, h, row0, m0, 2u, COL, 1.0)"),
    );
    v
}

/// The WGSL of one variant.
pub fn source(mode: CoopMode, td: DType, d: u32, tile: CoopTile) -> Result<String, Error> {
    render("flash_attention_coop", SOURCE, &variant(mode, td, d, tile))
}
