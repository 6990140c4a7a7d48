//! The cooperative-matrix (tensor core) matmul (shaders/matmul_coop.wgsl with
//! shaders/matmul_coop_operand.wgsl): chosen for f16 A and B when the adapter grants
//! 16x16x16 f16 -> f32 and subgroups of 32. The host picks, per launch, each operand's
//! load (its orientation and vector width, from its strides and alignment) and the tile
//! (from the shape); the tuning sweep (`wgtrain bench --tune-matmul`) may force a tile.
//!
//! May call: `error`, `kernels::common`, `kernels::matmul_params`, `runtime`, `tensor`.

use super::common::ACTIVATIONS;
use super::matmul_params::{Activation, COMMON, Load, MatmulOptions, MatmulTile, Params, wave_fill};
use crate::error::Error;
use crate::runtime::{Runtime, render, repeat_marked};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/matmul_coop.wgsl");
const OPERAND: &str = include_str!("../../../shaders/matmul_coop_operand.wgsl");

/// 128 x 128 of C per workgroup: 8 subgroups of 64 x 32, K by 32, double-buffered.
pub const TILE_128: MatmulTile = MatmulTile::new(2, 4, 4, 2, 32, 2);
/// 128 x 256 of C per workgroup: 8 subgroups of 64 x 64, K by 32, one buffer (two do
/// not fit in 48 KiB). On the H100 (`wgtrain bench --tune`, vector tiles): within 2% of
/// the fastest at 4096^3 and 9-11% faster than the 128 x 128 tiles at GPT-2's two largest
/// dW products; not picked (its split-K would differ).
pub const TILE_WIDE: MatmulTile = MatmulTile::new(2, 4, 4, 4, 32, 1);
/// 64 x 64 of C per workgroup (4 subgroups of 32 x 32), for outputs too small to fill
/// the device with larger tiles.
pub const TILE_64: MatmulTile = MatmulTile::new(2, 2, 2, 2, 32, 2);
/// 128 x 64 of C per workgroup (8 subgroups of 32 x 32, K by 32, double-buffered), for
/// products 64 wide (a 64-channel convolution's output): whole tiles where a 128 x 128
/// tile would compute half a tile of nothing, with bounds checks. On the H100 the
/// ResNet-50 fp16-mixed step took 125.9 ms against 128.4 with 128 x 128 tiles (batch
/// 256, same call), though its 3x3 64-channel layer alone ran 3-4% slower (756 against
/// 729 us forward): the 1x1 layers 64 wide gained.
pub const TILE_128X64: MatmulTile = MatmulTile::new(4, 2, 2, 2, 32, 2);
/// 64 x 128 (8 subgroups of 32 x 32): [`TILE_128X64`] for products 64 tall (a
/// 64-channel convolution's weight gradient).
pub const TILE_64X128: MatmulTile = MatmulTile::new(2, 4, 2, 2, 32, 2);
/// 128 x 128 of C per workgroup, K by 64 through one buffer, one workgroup per SM on the
/// H100: the faster 128 x 128 tile where [`by_waves`] finds the last wave too empty for
/// two per SM (GPT-2's N = 768 products).
pub const TILE_128_K64: MatmulTile = MatmulTile::new(2, 4, 4, 2, 64, 1);
/// 128 x 128 of C per workgroup from 4 subgroups of 64 x 64, K by 32, one buffer: at
/// 128 threads two workgroups fit an SM. The fastest 128 x 128 tile at dW products (A a
/// transposed view) with long K slices on the H100 (CHANGELOG.md); [`by_waves`]
/// weighs it against [`TILE_128_AHEAD`].
pub const TILE_128_SLIM: MatmulTile = MatmulTile::new(2, 2, 4, 4, 32, 1);
/// [`TILE_128_K64`] with two K tiles in flight in registers (238 registers, still one
/// workgroup per SM): faster at every GPT-2 product but the dW products with long K
/// slices, and at 4096^3 (`wgtrain bench --tune` on the H100: 613.4 against
/// [`TILE_128_SLIM`]'s 639.3 us; CHANGELOG.md). [`by_waves`]'s one-workgroup-per-SM
/// tile.
pub const TILE_128_AHEAD: MatmulTile = TILE_128_K64.two_ahead();
/// 128 x 128 of C from 16 subgroups of 32 x 32, K by 32, two K tiles in flight (512
/// threads at 108 registers: one workgroup per SM). With bounds checks on every load it
/// was the fastest at GPT-2's dW products split along K; with whole tiles loaded
/// unchecked [`TILE_128_AHEAD`] is faster at all four (fc.dw 262.8 against 296.7 us;
/// CHANGELOG.md), so only the sweep runs it.
pub const TILE_128_SPLIT: MatmulTile = MatmulTile::new(4, 4, 2, 2, 32, 1).two_ahead();
/// [`TILE_128_SLIM`]'s speed over [`TILE_128_AHEAD`]'s where both fill their waves and
/// A is a transposed view (a dW product): GPT-2's qkv.dw on the H100, 4 slices of 2048,
/// 184.0 against 199.2 us (CHANGELOG.md). Where A's rows are contiguous the two-ahead
/// tile is faster even there (4096^3: 613.4 against 639.3 us), so the 128-thread tile is
/// weighed only for a transposed A.
const SLIM_SPEEDUP: f64 = 1.08;
/// The shortest K loop (per split-K slice) for which [`by_waves`] weighs
/// [`TILE_128_SLIM`]: below it the two tiles in flight win (GPT-2's attn_proj.dw, 8 slices
/// of 1024, on the H100: 104.7 us against 96.2).
const SLIM_MIN_K: u32 = 2048;
/// The tiles the tuning sweep measures (CHANGELOG.md has their rows on the H100).
pub const CANDIDATES: [MatmulTile; 26] = [
    TILE_128_K64,
    TILE_128,
    TILE_WIDE,
    TILE_64,
    TILE_128X64,
    TILE_64X128,
    MatmulTile::new(4, 2, 4, 2, 32, 1),
    MatmulTile::new(2, 2, 4, 4, 64, 1),
    MatmulTile::new(4, 2, 2, 4, 64, 1),
    MatmulTile::new(2, 2, 2, 2, 64, 1),
    TILE_128_SLIM,
    MatmulTile::new(2, 2, 4, 4, 32, 2),
    MatmulTile::new(2, 4, 4, 2, 16, 2),
    MatmulTile::new(2, 4, 4, 4, 16, 2),
    // 128 x 128 from more, smaller subgroup tiles (8 or 16 warps a workgroup).
    MatmulTile::new(2, 4, 4, 2, 32, 1),
    MatmulTile::new(4, 2, 2, 4, 32, 1),
    MatmulTile::new(4, 4, 2, 2, 32, 1),
    // Two K tiles in flight in registers.
    TILE_128_AHEAD,
    TILE_128_SLIM.two_ahead(),
    TILE_WIDE.two_ahead(),
    MatmulTile::new(2, 4, 4, 2, 32, 1).two_ahead(),
    TILE_128_SPLIT,
    // 96 x 96: a 768 x 768 output (GPT-2's attn_proj.dw, 36 tiles of 128 x 128) in 64
    // tiles, so that two K slices fill one wave of 132 workgroups. Slower than the 128
    // x 128 tiles on the H100, save that one product (CHANGELOG.md): not picked.
    MatmulTile::new(3, 2, 2, 3, 64, 1),
    MatmulTile::new(3, 2, 2, 3, 64, 1).two_ahead(),
    MatmulTile::new(2, 2, 3, 3, 64, 1),
    MatmulTile::new(2, 3, 3, 2, 32, 2),
];

/// Bytes of workgroup memory a variant uses.
pub fn workgroup_bytes(tile: MatmulTile) -> u64 {
    // Either orientation pads the BK side or the BM/BN side by 8; the larger is counted.
    let side = |mn: u32| u64::from((mn * (tile.bk + 8)).max(tile.bk * (mn + 8)));
    2 * u64::from(tile.nbuf) * (side(tile.bm()) + side(tile.bn())) + 4 * 256 * u64::from(tile.gm * tile.gn)
}

fn operand(x: &str, tile: MatmulTile, load: Load, whole: bool) -> Result<String, Error> {
    let is_a = x == "a";
    let mn = if is_a { tile.bm() } else { tile.bn() };
    // Storage orientation: A rows are M (row) or K (col); B rows are K (row) or N (col).
    let (rows, cols) = if load.col == is_a { (tile.bk, mn) } else { (mn, tile.bk) };
    let index = if load.col == is_a { "kk * ld + major" } else { "major * ld + kk" };
    let ty = match load.width {
        8 => "H8",
        4 => "vec4<f16>",
        _ => "f16",
    };
    // The workgroup tile's element: vec4<f16> where loads are vectors.
    let (tile_ty, tw) = if load.width >= 4 { ("vec4<f16>", 4) } else { ("f16", 1) };
    let values = [
        ("X", x.to_string()),
        ("ROLE", if is_a { "A" } else { "B" }.to_string()),
        ("BINDING", if is_a { "1" } else { "2" }.to_string()),
        ("TYPE", ty.to_string()),
        ("TILE_TYPE", tile_ty.to_string()),
        ("TW", tw.to_string()),
        ("W8", (load.width == 8).to_string()),
        ("ROWS", rows.to_string()),
        ("COLS", cols.to_string()),
        ("W", load.width.to_string()),
        ("TILE_LEN", (rows * (cols + 8) * tile.nbuf).to_string()),
        ("COL", load.col.to_string()),
        ("CHECKED", (!whole).to_string()),
        ("INDEX", index.to_string()),
    ];
    // One line per fetched vector: LOADS of them.
    let loads = rows * (cols / load.width) / tile.threads();
    Ok(repeat_marked(&render("matmul_coop_operand", OPERAND, &values)?, "@l", loads))
}

/// The unrolled per-fragment code: accumulator declarations, a K tile's fragment loads
/// and multiply-adds (each 16-step written out), the wide stores and the staged stores.
fn unrolled(tile: MatmulTile) -> [String; 4] {
    use std::fmt::Write;
    let frags = || (0..tile.fm).flat_map(|i| (0..tile.fn_).map(move |j| (i, j)));
    let (mut decl, mut mma, mut wide, mut staged) = (String::new(), String::new(), String::new(), String::new());
    for (i, j) in frags() {
        let _ = writeln!(decl, "    var acc_{i}_{j} = coop_mat16x16<f32, C>();");
    }
    for kk in (0..tile.bk).step_by(16) {
        let _ = writeln!(mma, "        {{\n            let kk = {kk}u;");
        for i in 0..tile.fm {
            let _ = writeln!(mma, "            let a_{i} = a_frag(cur, m0 + {}u, kk);", 16 * i);
        }
        for j in 0..tile.fn_ {
            let _ = writeln!(mma, "            let b_{j} = b_frag(cur, n0 + {}u, kk);", 16 * j);
        }
        for (i, j) in frags() {
            let _ = writeln!(mma, "            acc_{i}_{j} = coopMultiplyAdd(a_{i}, b_{j}, acc_{i}_{j});");
        }
        mma += "        }\n";
    }
    for (i, j) in frags() {
        let _ = writeln!(
            staged,
            "    store_staged(acc_{i}_{j}, s, lane, gm0 + {}u, gn0 + {}u, c_base);",
            16 * i,
            16 * j
        );
        let _ = writeln!(
            wide,
            "            store_wide(acc_{i}_{j}, s, lane, gm0 + {}u, gn0 + {}u, c_base);",
            16 * i,
            16 * j
        );
    }
    [decl, mma, wide, staged]
}

/// Whether a launch of `tile` covers whole tiles: M, N and K multiples of the tile's, and
/// an even count of K tiles where the loop takes two a turn (its odd count gets a tile
/// of zeros, which the loads' bounds checks make). Then the variant loads without them.
pub fn whole(params: &Params, tile: MatmulTile) -> bool {
    let tiles = params.k / tile.bk;
    params.m.is_multiple_of(tile.bm())
        && params.n.is_multiple_of(tile.bn())
        && params.k.is_multiple_of(tile.bk)
        && tiles > 0
        && (!tile.pairs() || tiles.is_multiple_of(2))
}

/// The template values of one variant; `whole` as [`whole`] says; `plain` where the
/// epilogue does nothing ([`plain`]).
pub fn variant(
    tc: DType,
    act: Activation,
    (a, b): (Load, Load),
    tile: MatmulTile,
    whole: bool,
    plain: bool,
) -> Result<Vec<(&'static str, String)>, Error> {
    let a_fetch = if a.col {
        "k0, row0, p.k, p.m, p.a_cs, p.a_rs"
    } else {
        "row0, k0, p.m, p.k, p.a_rs, p.a_cs"
    };
    let b_fetch = if b.col {
        "col0, k0, p.n, p.k, p.b_cs, p.b_rs"
    } else {
        "k0, col0, p.k, p.n, p.b_rs, p.b_cs"
    };
    let [decl, mma, wide, staged] = unrolled(tile);
    Ok(vec![
        ("ACC_DECL", decl),
        ("MMA", mma),
        ("STORE_STAGED", staged),
        ("STORE_WIDE", wide),
        ("MATMUL_COMMON", COMMON.into()),
        ("TC", tc.wgsl().into()),
        ("ACT", act.expr().into()),
        ("ACTIVATIONS", ACTIVATIONS.into()),
        ("GM", tile.gm.to_string()),
        ("GN", tile.gn.to_string()),
        ("FM", tile.fm.to_string()),
        ("FN", tile.fn_.to_string()),
        ("BK", tile.bk.to_string()),
        ("NBUF", tile.nbuf.to_string()),
        ("AHEAD", tile.ahead.to_string()),
        ("PAIRS", tile.pairs().to_string()),
        ("CHECKED", (!whole).to_string()),
        ("PLAIN", plain.to_string()),
        ("THREADS", tile.threads().to_string()),
        ("STAGE_LEN", (256 * tile.gm * tile.gn).to_string()),
        ("OPERAND_A", operand("a", tile, a, whole)?),
        ("OPERAND_B", operand("b", tile, b, whole)?),
        ("A_FETCH", a_fetch.into()),
        ("B_FETCH", b_fetch.into()),
    ])
}

/// Whether the host may pick this path for these operands on this adapter.
pub fn usable(rt: &Runtime, a: &Tensor, b: &Tensor, c: &Tensor) -> bool {
    eligible(
        rt.gpu.caps.coop_f16_16x16x16(),
        rt.gpu.caps.subgroup_size,
        a.dtype(),
        b.dtype(),
        c.dtype(),
    )
}

/// The rule behind [`usable`], apart from the adapter (tested on every machine).
pub fn eligible(coop_f16: bool, subgroup_size: (u32, u32), a: DType, b: DType, c: DType) -> bool {
    coop_f16 && subgroup_size == (32, 32) && a == DType::F16 && b == DType::F16 && c.is_float()
}

/// The tile for an `m` x `n` output of `batches` batches: 128 x 128 by 64 when that
/// fills the device once (`wave` workgroups: one per multiprocessor) or for a single product (split-K
/// fills the device), 128 x 64 or 64 x 128 where the output is 64 wide or tall; 64 x 64
/// for batches of small products. (The caller then chooses between the 128 x 128 tiles
/// by [`by_waves`], once it knows the split.)
pub fn pick(m: u32, n: u32, batches: u32, wave: u64) -> MatmulTile {
    let tiles = u64::from(m.div_ceil(128)) * u64::from(n.div_ceil(128)) * u64::from(batches);
    if !(tiles >= wave || batches == 1) {
        TILE_64
    } else if n == 64 && m > 64 {
        TILE_128X64
    } else if m == 64 && n > 64 {
        TILE_64X128
    } else {
        TILE_128_K64
    }
}

/// The 128 x 128 tile for a launch of `workgroups` (output tiles times split-K slices)
/// with a K loop of `k` (per slice), A a transposed view where `a_col`:
/// [`TILE_128_SLIM`] runs two workgroups per SM, [`TILE_128_AHEAD`] one (`wave` of
/// them at once). The second, unless A is transposed and the loop is at least [`SLIM_MIN_K`]
/// long: then each one's share of busy SMs over its waves, weighed by its speed at full
/// waves. E.g. GPT-2's qkv.dw (108 tiles x 4 slices of 2048) fills both alike and takes
/// the first; fc.dw (144 x 4) fills 87% of waves of one per SM and 73% of two per SM, and
/// takes the second.
pub fn by_waves(workgroups: u64, k: u32, a_col: bool, wave: u64) -> MatmulTile {
    let slim = wave_fill(workgroups, 2 * wave) * SLIM_SPEEDUP;
    if a_col && k >= SLIM_MIN_K && slim > wave_fill(workgroups, wave) {
        TILE_128_SLIM
    } else {
        TILE_128_AHEAD
    }
}

/// Whether the epilogue leaves the product as it is: no bias, activation, scale or
/// accumulation (the variant that stores it without reading the epilogue's parameters).
pub fn plain(opts: &MatmulOptions) -> bool {
    opts.bias.is_none() && opts.activation == Activation::Identity && opts.alpha == 1.0 && opts.beta == 0.0
}

/// Whether whole tiles may store four neighbouring elements of C at once (`store_wide`):
/// C's offset and strides multiples of 4 elements.
pub fn wide(params: &Params) -> bool {
    [params.c_off, params.c_rs, params.c_bs0, params.c_bs1].iter().all(|v| v % 4 == 0)
}

/// The WGSL of the variant with C of type `tc`, epilogue `act`, operand loads `loads`,
/// `tile`, whole tiles (`whole`: no bounds checks) and the PLAIN epilogue (`plain`).
pub fn source(tc: DType, act: Activation, loads: (Load, Load), tile: MatmulTile, whole: bool, plain: bool) -> Result<String, Error> {
    render("matmul_coop", SOURCE, &variant(tc, act, loads, tile, whole, plain)?)
}
