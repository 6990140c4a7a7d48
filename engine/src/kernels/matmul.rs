//! Batched matmul (shaders/matmul.wgsl): strided operands (transposes are views),
//! up to two batch dimensions with broadcasting, f32 or f16 inputs with f32
//! accumulation, and a bias + activation epilogue. The cooperative-matrix path
//! (shaders/matmul_coop.wgsl) is chosen for f16 inputs when the adapter grants
//! 16x16x16 f16 -> f32 configurations.
//!
//! May call: `error`, `kernels::common`, `kernels::matmul_coop`,
//! `kernels::matmul_params`, `memory`, `runtime`, `tensor`.

use super::common::{ACTIVATIONS, check_tensor, enables, require_f16};
pub use super::matmul_params::{Activation, MatmulOptions, SimtTile};
use super::matmul_params::{COMMON, FULL_WAVE, Load, Params, SLICE_UNIT, SLICED};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/matmul.wgsl");

/// The register code of a TM x TM thread tile: accumulators `acc{r}_{q}` (row r,
/// column vec4 q), the rank-1 update of one k, and the stores.
fn register_code(tm: u32) -> (String, String, String) {
    let q_count = tm / 4;
    let (mut decl, mut step, mut store) = (String::new(), String::new(), String::new());
    for r in 0..tm {
        for q in 0..q_count {
            decl += &format!("    var acc{r}_{q} = vec4<f32>(0.0);\n");
        }
    }
    // One k: `base` is the k row's first vec4.
    for q in 0..q_count {
        step += &format!("                let a{q} = a_tile[base + ty + {}u];\n", 16 * q);
        step += &format!("                let b{q} = b_tile[base + tx + {}u];\n", 16 * q);
    }
    for r in 0..tm {
        let lane = ["x", "y", "z", "w"][(r % 4) as usize];
        for q in 0..q_count {
            step += &format!(
                "                acc{r}_{q} = fma(vec4<f32>(a{}.{lane}), b{q}, acc{r}_{q});\n",
                r / 4
            );
        }
    }
    for r in 0..tm {
        for q in 0..q_count {
            store += &format!(
                "    store4(c_base, row0 + {}u + ty * 4u + {}u, col0 + {}u + tx * 4u, acc{r}_{q});\n",
                (r / 4) * 64,
                r % 4,
                q * 64
            );
        }
    }
    (decl, step, store)
}

/// Where each lane's thread tile sits in the workgroup's 16 x 16 grid: `square` puts a
/// warp's 32 lanes on 8 x 4 positions, so each k's reads are 8 and 4 consecutive vec4s
/// (one workgroup-memory transaction each) rather than 16 and 2.
fn lanes(square: bool) -> &'static str {
    if square {
        "    let tx = tid % 8u + 8u * ((tid / 32u) % 2u);\n    let ty = (tid / 8u) % 4u + 4u * (tid / 64u);"
    } else {
        "    let tx = lid.x;\n    let ty = lid.y;"
    }
}

/// The template values of the tiled variant; `la` / `lb` pick each operand's tile
/// loads (width 4: vec4 along rows, or along columns for `col`; width 1: scalar).
/// Whether an `m` x `n` x `k` product covers whole tiles of the tiled kernel with TM
/// `tm` and K by `bk`, with both operands' rows contiguous and loaded as vec4s (`la`,
/// `lb`): then its variant loads without bounds checks. (With a transposed view among
/// the operands the unchecked loads were slower on the H100: GPT-2's dX products 25%
/// slower, its forward products 1-24% faster; docs/benchmarks.md.)
pub fn whole_tiles(m: usize, n: usize, k: usize, tm: u32, bk: u32, [la, lb]: [Load; 2]) -> bool {
    let (bm, bk) = (16 * tm as usize, bk as usize);
    la.vec4_rows() && lb.vec4_rows() && m.is_multiple_of(bm) && n.is_multiple_of(bm) && k.is_multiple_of(bk) && k > 0
}

/// The template values of one variant; `whole` as [`whole_tiles`] says.
pub fn variant(
    [ta, tb, tc]: [DType; 3],
    tm: u32,
    tile: SimtTile,
    act: Activation,
    [la, lb]: [Load; 2],
    whole: bool,
) -> Vec<(&'static str, String)> {
    let (decl, step, store) = register_code(tm);
    let ty = |t: DType, l: Load| {
        if l.width == 4 {
            format!("vec4<{}>", t.wgsl())
        } else {
            t.wgsl().to_string()
        }
    };
    vec![
        ("MATMUL_COMMON", COMMON.into()),
        ("TYPE_A", ty(ta, la)),
        ("TYPE_B", ty(tb, lb)),
        ("VEC_A", (la.width == 4 && !la.col).to_string()),
        ("VEC_B", (lb.width == 4 && !lb.col).to_string()),
        ("COL_A", (la.width == 4 && la.col).to_string()),
        ("COL_B", (lb.width == 4 && lb.col).to_string()),
        ("LANES", lanes(tile.square).into()),
        ("NBUF", tile.nbuf.to_string()),
        ("BK", tile.bk.to_string()),
        ("KSTEPS", format!("{}{}", tile.bk, if tile.unroll { "" } else { " loop" })),
        ("ONE_BUFFER", (tile.nbuf == 1).to_string()),
        ("WHOLE", whole.to_string()),
        ("ACC_DECL", decl),
        ("STEP", step),
        ("STORE", store),
        ("ENABLE", enables(&[ta, tb, tc])),
        ("TA", ta.wgsl().into()),
        ("TB", tb.wgsl().into()),
        ("TC", tc.wgsl().into()),
        ("TM", tm.to_string()),
        ("ACT", act.expr().into()),
        ("ACTIVATIONS", ACTIVATIONS.into()),
    ]
}

/// Batch sizes and strides of a [.., R, C] view, padded to two batch dims.
fn batch_dims(t: &Tensor) -> ([usize; 2], [usize; 2]) {
    let rank = t.shape().len();
    let mut dims = [1usize; 2];
    let mut strides = [0usize; 2];
    for k in 0..rank.saturating_sub(2) {
        let slot = 2 - (rank - 2) + k;
        dims[slot] = t.shape()[k];
        strides[slot] = if t.shape()[k] == 1 { 0 } else { t.strides()[k] };
    }
    (dims, strides)
}

/// Shape of the product of a [.., M, K] and b [.., K, N] (batch dims broadcast).
pub fn output_shape(a: &Tensor, b: &Tensor) -> Result<Vec<usize>, Error> {
    let (ra, rb) = (a.shape().len(), b.shape().len());
    if !(2..=4).contains(&ra) || !(2..=4).contains(&rb) {
        return Err(Error::shape(
            "matmul",
            "operands of rank 2 to 4",
            format!("{:?} and {:?}", a.shape(), b.shape()),
        ));
    }
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(Error::shape(
            "matmul",
            "equal inner dimensions",
            format!("{:?} and {:?}", a.shape(), b.shape()),
        ));
    }
    let (da, _) = batch_dims(a);
    let (db, _) = batch_dims(b);
    let mut batch = Vec::new();
    for i in 0..2 {
        if da[i] != db[i] && da[i] != 1 && db[i] != 1 {
            return Err(Error::shape(
                "matmul",
                "batch dimensions that broadcast",
                format!("{:?} and {:?}", a.shape(), b.shape()),
            ));
        }
        batch.push(da[i].max(db[i]));
    }
    let lead = ra.max(rb) - 2;
    let mut shape: Vec<usize> = batch[2 - lead..].to_vec();
    shape.extend([m, n]);
    Ok(shape)
}

/// Vector width the tail split aligns to (the widest operand load).
const ALIGN: usize = 8;

/// c = act(alpha * a @ b + bias + beta * c); c's rows must be contiguous.
///
/// A 2-D product whose operands are aligned for vector loads except for an odd extent
/// (GPT-2's vocabulary of 50257, with logit rows padded) runs as two: the aligned bulk
/// with vector loads, and the few leftover rows, columns or K steps with scalar ones
/// (K's leftover accumulates onto the bulk's result; the split is fixed by the shapes, so
/// results repeat exactly).
pub fn matmul_into(rt: &Runtime, a: &Tensor, b: &Tensor, c: &Tensor, opts: &MatmulOptions) -> Result<(), Error> {
    if let Some(parts) = tail_split(a, b, c, opts)? {
        for (a, b, c, opts) in &parts {
            matmul_into(rt, a, b, c, opts)?;
        }
        return Ok(());
    }
    matmul_whole(rt, a, b, c, opts)
}

type Part<'a> = (Tensor, Tensor, Tensor, MatmulOptions<'a>);

/// The two products a misaligned extent splits into (see [`matmul_into`]), or None.
fn tail_split<'a>(a: &Tensor, b: &Tensor, c: &Tensor, opts: &MatmulOptions<'a>) -> Result<Option<Vec<Part<'a>>>, Error> {
    let ([m, k], [k2, n], [_, _]) = (a.shape(), b.shape(), c.shape()) else {
        return Ok(None);
    };
    let (m, k, n) = (*m, *k, *n);
    if k != *k2 || c.shape() != [m, n] || c.strides()[1] != 1 {
        return Ok(None); // matmul_whole reports it
    }
    let aligned = |t: &Tensor, dim: usize| {
        let other = t.strides()[1 - dim];
        t.strides()[dim] == 1 && t.offset().is_multiple_of(ALIGN) && other.is_multiple_of(ALIGN)
    };
    let bulk = |len: usize| len - len % ALIGN;
    // K, contiguous in A's rows or B's columns: the bulk, then the rest accumulated.
    if k % ALIGN != 0 && k > ALIGN && opts.activation == Activation::Identity && (aligned(a, 1) || aligned(b, 0)) {
        let kb = bulk(k);
        let rest = MatmulOptions {
            beta: 1.0,
            bias: None,
            ..*opts
        };
        return Ok(Some(vec![
            (a.slice(1, 0, kb)?, b.slice(0, 0, kb)?, c.clone(), *opts),
            (a.slice(1, kb, k - kb)?, b.slice(0, kb, k - kb)?, c.clone(), rest),
        ]));
    }
    // M, contiguous down A's columns: rows of C apart.
    if m % ALIGN != 0 && m > ALIGN && aligned(a, 0) && a.strides()[1] != 1 {
        let mb = bulk(m);
        return Ok(Some(vec![
            (a.slice(0, 0, mb)?, b.clone(), c.slice(0, 0, mb)?, *opts),
            (a.slice(0, mb, m - mb)?, b.clone(), c.slice(0, mb, m - mb)?, *opts),
        ]));
    }
    // N, contiguous along B's rows: columns of C apart (not with a bias: the options
    // borrow it whole).
    if n % ALIGN != 0 && n > ALIGN && aligned(b, 1) && b.strides()[0] != 1 && opts.bias.is_none() {
        let nb = bulk(n);
        return Ok(Some(vec![
            (a.clone(), b.slice(1, 0, nb)?, c.slice(1, 0, nb)?, *opts),
            (a.clone(), b.slice(1, nb, n - nb)?, c.slice(1, nb, n - nb)?, *opts),
        ]));
    }
    Ok(None)
}

fn matmul_whole(rt: &Runtime, a: &Tensor, b: &Tensor, c: &Tensor, opts: &MatmulOptions) -> Result<(), Error> {
    let shape = output_shape(a, b)?;
    if c.shape() != shape.as_slice() {
        return Err(Error::shape("matmul output", format!("{shape:?}"), format!("{:?}", c.shape())));
    }
    check_tensor("matmul a", a, a.dtype())?;
    check_tensor("matmul b", b, b.dtype())?;
    check_tensor("matmul c", c, c.dtype())?;
    for (what, t) in [("a", a), ("b", b), ("c", c)] {
        if !t.dtype().is_float() {
            return Err(Error::shape(format!("matmul {what}"), "f32 or f16", t.dtype()));
        }
    }
    let rc = c.shape().len();
    if c.strides()[rc - 1] != 1 && c.shape()[rc - 1] > 1 {
        return Err(Error::shape(
            "matmul output",
            "contiguous rows",
            format!("strides {:?}", c.strides()),
        ));
    }
    require_f16(rt, &[a.dtype(), b.dtype(), c.dtype()])?;
    let (ra, rb) = (a.shape().len(), b.shape().len());
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let (_, sa) = batch_dims(a);
    let (_, sb) = batch_dims(b);
    let (dc, sc) = batch_dims(c);
    if let Some(bias) = opts.bias {
        check_tensor("matmul bias", bias, DType::F32)?;
        if bias.shape() != [n] || bias.strides() != [1] {
            return Err(Error::shape(
                "matmul bias",
                format!("a contiguous [{n}]"),
                format!("{:?}", bias.shape()),
            ));
        }
    }
    let batches = dc[0] * dc[1];
    if m == 0 || n == 0 || batches == 0 {
        return Ok(());
    }
    if batches > 65535 {
        return Err(Error::shape("matmul", "at most 65535 batches", batches));
    }
    let params = Params {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        batch1: dc[1] as u32,
        a_off: a.offset() as u32,
        a_rs: a.strides()[ra - 2] as u32,
        a_cs: a.strides()[ra - 1] as u32,
        a_bs0: sa[0] as u32,
        a_bs1: sa[1] as u32,
        b_off: b.offset() as u32,
        b_rs: b.strides()[rb - 2] as u32,
        b_cs: b.strides()[rb - 1] as u32,
        b_bs0: sb[0] as u32,
        b_bs1: sb[1] as u32,
        c_off: c.offset() as u32,
        c_rs: c.strides()[rc - 2] as u32,
        c_bs0: sc[0] as u32,
        c_bs1: sc[1] as u32,
        bias_off: opts.bias.map_or(0, |t| t.offset() as u32),
        has_bias: opts.bias.is_some() as u32,
        alpha: opts.alpha,
        beta: opts.beta,
        flags: 0,
        splits: 1,
    };
    let coop = !opts.tiled_only && super::matmul_coop::usable(rt, a, b, c);
    let coop_tile = coop.then(|| {
        opts.coop_tile
            .unwrap_or_else(|| super::matmul_coop::pick(m as u32, n as u32, batches as u32))
    });
    let (tile_m, tile_n) = coop_tile.map_or_else(
        || (tiled_tile(m, n) as u64, tiled_tile(m, n) as u64),
        |t| (u64::from(t.bm()), u64::from(t.bn())),
    );
    let tiles = (m as u64).div_ceil(tile_m) * (n as u64).div_ceil(tile_n) * batches as u64;
    let wave_split = !coop && opts.simt_tile.unwrap_or(SimtTile::DEFAULT).wave_split;
    let splits = match opts.split_k {
        Some(s) if s == 0 || (s > 1 && batches > 1) => {
            return Err(Error::invalid(
                "matmul K slices",
                format!("{s} slices (at least 1, and only a single product is split)"),
            ));
        }
        Some(s) => s,
        None => {
            let a_col = Load::of_operands(&params, &[8, 4])[0].col;
            let uneven = coop_tile.is_some_and(|t| t.bm() == 128 && t.bn() == 128)
                && [super::matmul_coop::TILE_128_AHEAD, super::matmul_coop::TILE_128_SLIM]
                    .iter()
                    .all(|&t| sliceable(&params, 1, t));
            slices(tiles, k, batches, wave_split, coop.then_some((a_col, uneven)))
        }
    };
    // The longest slice: uneven slices are whole units of SLICE_UNIT.
    let slice_len = if k.is_multiple_of(SLICE_UNIT) && splits <= k / SLICE_UNIT {
        (k / SLICE_UNIT).div_ceil(splits) * SLICE_UNIT
    } else {
        k / splits
    };
    // Between the two 128 x 128 tensor-core tiles, by how the launch fills its waves.
    let coop_tile = match coop_tile {
        Some(t) if opts.coop_tile.is_none() && t.bm() == 128 && t.bn() == 128 => {
            let a_col = Load::of_operands(&params, &[8, 4])[0].col;
            Some(super::matmul_coop::by_waves(tiles * splits as u64, slice_len as u32, a_col))
        }
        t => t,
    };
    if splits == 1 {
        let opts = MatmulOptions { coop_tile, ..*opts };
        return launch_product(rt, &params, a, b, c, &opts, batches as u32);
    }
    // Split K: each slice's product into its own partial (the slices are the batches of
    // the first pass: its batch strides step along K), then the partials summed in order
    // through the epilogue.
    let need = splits * m * n;
    let parts = match opts.scratch {
        Some(t) if t.dtype() == DType::F32 && t.is_contiguous() && t.numel() >= need => {
            t.reshape(&[t.numel()])?.slice(0, 0, need)?.reshape(&[splits, m, n])?
        }
        _ => Tensor::empty(rt, &[splits, m, n], DType::F32, Category::Temporary, "matmul.splitk")?,
    };
    // The tensor-core kernel takes uneven slices of whole tiles itself (`SLICED`); other
    // launches step along K by their batch strides, in equal slices.
    let sliced = coop_tile.is_some_and(|t| sliceable(&params, splits, t));
    if !(sliced || k.is_multiple_of(splits) && k / splits > 0) {
        return Err(Error::invalid(
            "matmul K slices",
            format!("{splits} slices of K = {k} (equal slices here: K a multiple of the count)"),
        ));
    }
    let kc = if sliced { k as u32 } else { (k / splits) as u32 };
    let first = Params {
        k: kc,
        flags: if sliced { SLICED } else { 0 },
        splits: if sliced { splits as u32 } else { 1 },
        batch1: 1,
        a_bs0: if sliced { 0 } else { kc * params.a_cs },
        a_bs1: 0,
        b_bs0: if sliced { 0 } else { kc * params.b_rs },
        b_bs1: 0,
        c_off: parts.offset() as u32,
        c_rs: n as u32,
        c_bs0: (m * n) as u32,
        c_bs1: 0,
        bias_off: 0,
        has_bias: 0,
        alpha: 1.0,
        beta: 0.0,
        ..params
    };
    let plain = MatmulOptions {
        tiled_only: opts.tiled_only,
        coop_tile,
        simt_tile: opts.simt_tile,
        ..Default::default()
    };
    launch_product(rt, &first, a, b, &parts, &plain, splits as u32)?;
    // Four elements a thread where a row's quads are aligned in C and in the partials.
    let quads = n.is_multiple_of(4) && parts.offset() == 0 && params.c_off.is_multiple_of(4) && params.c_rs.is_multiple_of(4);
    let second = Params {
        splits: splits as u32,
        flags: u32::from(quads),
        ..params
    };
    let kernel = rt.kernel(
        KernelKey::new("matmul_splitk", &[c.dtype() as u32, opts.activation as u32]),
        5,
        || render("matmul_splitk", SPLIT_SOURCE, &split_variant(c.dtype(), opts.activation)),
    )?;
    let bias = opts.bias.unwrap_or(c);
    rt.launch_with_work(
        &kernel,
        bytemuck::bytes_of(&second),
        &[&parts, &parts, c, bias, c],
        crate::runtime::grid((m * n).div_ceil(if quads { 1024 } else { 256 }) as u32),
        None,
        2,
    )
}

/// Whether the tensor-core kernel with `tile` can take this product in `splits` uneven K
/// slices (`SLICED`): K a multiple of [`SLICE_UNIT`], a unit at least a slice, and whole
/// tiles (the loads are unchecked, so no slice reads into the next).
fn sliceable(params: &Params, splits: usize, tile: super::matmul_params::CoopTile) -> bool {
    let k = params.k as usize;
    let all = Params { flags: SLICED, ..*params };
    k.is_multiple_of(SLICE_UNIT) && splits <= k / SLICE_UNIT && super::matmul_coop::whole(&all, tile)
}

/// K slices of a product of `tiles` output tiles (over all `batches`) and inner size
/// `k`: by wave fill for the tiled kernel's wave-split variants, [`split_k_coop`] for the
/// tensor-core kernel (`coop`: whether A is a transposed view, and whether uneven slices
/// may be taken), else [`split_k`]; a batched product is not split.
fn slices(tiles: u64, k: usize, batches: usize, wave_split: bool, coop: Option<(bool, bool)>) -> usize {
    match (batches, coop) {
        (1, _) if wave_split => split_k_by_waves(tiles, k),
        (1, Some((a_col, uneven))) => split_k_coop(tiles, k, a_col, uneven),
        (1, None) => split_k(tiles, k),
        _ => 1,
    }
}

/// Microseconds on the H100 per wave and per [`SLICE_UNIT`] of a slice's K, for the
/// two-ahead tile (waves of one workgroup per SM) and the 128-thread tile (waves of two);
/// per partial tile of a split product (written, then read by the second pass); and per
/// split product (the second pass). Fit to GPT-2's four dW products at 1-8 and 11
/// slices (`wgtrain bench --filter .dw --splits N`, docs/launch-h100/call3): within 3%
/// of every row but qkv.dw unsplit (7%), and each product's fastest count is the
/// model's.
const SPLIT_MODEL_US: (f64, f64, f64, f64) = (2.307, 4.146, 0.074, 10.97);

/// The modelled time of a tensor-core product of `tiles` output tiles in `splits` slices
/// of at most `slice_units` units of K (see [`SPLIT_MODEL_US`]), with the 128 x 128 tile
/// that [`by_waves`](super::matmul_coop::by_waves) gives it.
pub fn split_cost(tiles: u64, splits: u64, slice_units: f64, a_col: bool) -> f64 {
    let (ahead, slim, partial, pass) = SPLIT_MODEL_US;
    let workgroups = tiles * splits;
    let len = (slice_units * SLICE_UNIT as f64) as u32;
    let work = if super::matmul_coop::by_waves(workgroups, len, a_col) == super::matmul_coop::TILE_128_SLIM {
        workgroups.div_ceil(2 * FULL_WAVE) as f64 * slice_units * slim
    } else {
        workgroups.div_ceil(FULL_WAVE) as f64 * slice_units * ahead
    };
    if splits > 1 {
        work + workgroups as f64 * partial + pass
    } else {
        work
    }
}

/// K slices for the tensor-core kernel: the count, up to 16, of least [`split_cost`].
/// With `uneven` (K a multiple of [`SLICE_UNIT`] and whole 128 x 128 tiles) any count of
/// whole units; otherwise 2, 4 or 8 equal slices at least 256 long and multiples of 8.
/// On the H100 this splits GPT-2's attn_proj.dw in 3 (69.3 us against 89.1 in the 8 slices
/// before), fc.dw and fc_proj.dw in 3 (224.6 against 238.1 in 4), and qkv.dw not at all
/// (158.0 against 177.2 in 4; docs/launch-h100/call3).
pub fn split_k_coop(tiles: u64, k: usize, a_col: bool, uneven: bool) -> usize {
    let units = k as f64 / SLICE_UNIT as f64;
    let cost = |s: usize| {
        let len = if uneven {
            (k / SLICE_UNIT).div_ceil(s) as f64
        } else {
            units / s as f64
        };
        split_cost(tiles, s as u64, len, a_col)
    };
    let fits = |s: usize| {
        if uneven {
            s <= k / SLICE_UNIT
        } else {
            s == 1 || [2, 4, 8].contains(&s) && k.is_multiple_of(8 * s) && k / s >= 256
        }
    };
    (1..=16)
        .filter(|&s| fits(s))
        .min_by(|&x, &y| cost(x).total_cmp(&cost(y)))
        .unwrap_or(1)
}

/// Bytes of split-K partials that the tiled kernel's default variant allocates for a
/// product [m, k] @ [k, n] (0 when it does not split): what a caller sizing its own
/// blocks around such a product leaves room for.
/// An upper bound: a K off the load alignment may be split into its aligned bulk and
/// the rest (`matmul_whole`), and either may be what is launched.
pub fn tiled_split_bytes(m: usize, n: usize, k: usize) -> u64 {
    let t = tiled_tile(m, n);
    let tiles = (m.div_ceil(t) * n.div_ceil(t)) as u64;
    let bulk = if k > ALIGN { k - k % ALIGN } else { k };
    let wave_split = SimtTile::DEFAULT.wave_split;
    match slices(tiles, k, 1, wave_split, None).max(slices(tiles, bulk, 1, wave_split, None)) {
        1 => 0,
        s => (s * m * n * 4) as u64,
    }
}

/// K slices for a single matmul of `tiles` output tiles and inner size `k`: none when the
/// tiles fill the device twice over (two workgroups run on each SM); otherwise the fewest
/// of 2, 4 or 8 slices that do, each slice at least 256 long and a multiple of 8
/// (aligned loads), or the most that stay so.
pub fn split_k(tiles: u64, k: usize) -> usize {
    if tiles >= 2 * FULL_WAVE {
        return 1;
    }
    let fits = |s: usize| k.is_multiple_of(8 * s) && k / s >= 256;
    [2, 4, 8]
        .into_iter()
        .find(|&s| fits(s) && tiles * s as u64 >= 2 * FULL_WAVE)
        .or_else(|| [8, 4, 2].into_iter().find(|&s| fits(s)))
        .unwrap_or(1)
}

/// K slices by wave fill, for a product of fewer tiles than one wave of the device
/// holds (two workgroups per SM): the split (2, 4 or 8; each slice at least 256 long and
/// a multiple of 8) whose workgroups fill their last wave best, the most slices among
/// equals. A product of a wave or more is not split: its slices' partials would cost
/// more than its last wave's idle SMs (measured at GPT-2's shapes).
pub fn split_k_by_waves(tiles: u64, k: usize) -> usize {
    let slots = 2 * FULL_WAVE;
    if tiles >= slots {
        return 1;
    }
    let fits = |s: usize| s == 1 || (k.is_multiple_of(8 * s) && k / s >= 256);
    // Fill in thousandths: work / (waves * slots).
    let fill = |s: usize| {
        let wgs = tiles * s as u64;
        wgs * 1000 / (wgs.div_ceil(slots) * slots)
    };
    let mut best = 1;
    for s in [2, 4, 8].into_iter().filter(|&s| fits(s)) {
        if fill(s) >= fill(best) {
            best = s;
        }
    }
    best
}

/// The tiled kernel's output tile (rows = columns).
fn tiled_tile(m: usize, n: usize) -> usize {
    if m >= 128 && n >= 128 { 128 } else { 64 }
}

/// The template values of the split-K second pass.
pub fn split_variant(tc: DType, act: Activation) -> Vec<(&'static str, String)> {
    vec![
        ("ENABLE", enables(&[tc])),
        ("MATMUL_COMMON", COMMON.into()),
        ("TC", tc.wgsl().into()),
        ("ACT", act.expr().into()),
        ("ACTIVATIONS", ACTIVATIONS.into()),
    ]
}

const SPLIT_SOURCE: &str = include_str!("../../../shaders/matmul_splitk.wgsl");

/// One product launch: the cooperative kernel where `opts.coop_tile` is set (the caller
/// found it usable), the tiled kernel otherwise.
fn launch_product(
    rt: &Runtime,
    params: &Params,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    opts: &MatmulOptions,
    batches: u32,
) -> Result<(), Error> {
    if opts.coop_tile.is_some() {
        return super::matmul_coop::launch(rt, params, a, b, c, opts, batches);
    }
    let (m, n, k) = (params.m as usize, params.n as usize, params.k as usize);
    let tile = tiled_tile(m, n);
    let tm = tile / 16;
    let [la, lb] = Load::of_operands(params, &[4]);
    let simt = opts.simt_tile.unwrap_or(SimtTile::DEFAULT);
    let whole = whole_tiles(m, n, k, tm as u32, simt.bk, [la, lb]);
    let kernel = rt.kernel(
        KernelKey::new(
            "matmul",
            &[
                a.dtype() as u32,
                b.dtype() as u32,
                c.dtype() as u32,
                tm as u32,
                opts.activation as u32,
                la.code() | lb.code() << 8 | u32::from(whole) << 16,
                simt.packed(),
            ],
        ),
        4,
        || {
            // Checked when the kernel is built (a forced variant may not fit).
            let limit = u64::from(rt.gpu.caps.limits.max_compute_workgroup_storage_size);
            if simt.workgroup_bytes(tm as u32) > limit {
                return Err(Error::invalid(
                    "matmul",
                    format!(
                        "a tiled variant within the adapter's {limit} bytes of workgroup memory ({} needs {})",
                        simt.name(),
                        simt.workgroup_bytes(tm as u32)
                    ),
                ));
            }
            render(
                "matmul",
                SOURCE,
                &variant([a.dtype(), b.dtype(), c.dtype()], tm as u32, simt, opts.activation, [la, lb], whole),
            )
        },
    )?;
    // Without a bias, any block fills the (unread) bias binding.
    let bias = opts.bias.unwrap_or(c);
    rt.launch_with_work(
        &kernel,
        bytemuck::bytes_of(params),
        &[a, b, c, bias],
        [n.div_ceil(tile) as u32, m.div_ceil(tile) as u32, batches],
        Some(2.0 * (m * n * k) as f64 * f64::from(batches)),
        2,
    )
}

/// A new tensor a @ b in `dtype` (f32 accumulation).
pub fn matmul(
    rt: &Runtime,
    a: &Tensor,
    b: &Tensor,
    dtype: DType,
    opts: &MatmulOptions,
    category: Category,
    label: &str,
) -> Result<Tensor, Error> {
    let shape = output_shape(a, b)?;
    let c = Tensor::empty(rt, &shape, dtype, category, label)?;
    matmul_into(rt, a, b, &c, opts)?;
    Ok(c)
}
