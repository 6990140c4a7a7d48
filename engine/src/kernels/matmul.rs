//! Batched matmul (shaders/matmul.wgsl): strided operands (transposes are views),
//! up to two batch dimensions with broadcasting, f32 or f16 inputs with f32
//! accumulation, and a bias + activation epilogue. The cooperative-matrix path
//! (shaders/matmul_coop.wgsl) is chosen for f16 inputs when the adapter grants
//! 16x16x16 f16 -> f32 configurations.
//!
//! What runs is chosen by `kernels::matmul_plan` (pure, testable without a GPU); this
//! file renders the tiled kernel's variants and launches a plan.
//!
//! May call: `error`, `kernels::common`, `kernels::matmul_coop`,
//! `kernels::matmul_params`, `kernels::matmul_plan`, `memory`, `runtime`, `tensor`.

use super::col_sums;
use super::common::{ACTIVATIONS, check_tensor, enables, require_f16};
pub use super::matmul_params::{Activation, MatmulOptions, SimtTile};
use super::matmul_params::{COMMON, Load, Params, SLICED};
use super::matmul_plan::{ALIGN, CoopKernel, split_name};
pub use super::matmul_plan::{MatmulPlan, ProductKernel, output_shape, plan, whole_tiles};
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

/// The template values of one variant; `la` / `lb` pick each operand's tile loads
/// (width 4: vec4 along rows, or along columns for `col`; width 1: scalar); `whole` as
/// [`whole_tiles`] says.
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
    check_tensor("matmul a", a, a.dtype())?;
    check_tensor("matmul b", b, b.dtype())?;
    check_tensor("matmul c", c, c.dtype())?;
    if let Some(bias) = opts.bias {
        check_tensor("matmul bias", bias, DType::F32)?;
    }
    require_f16(rt, &[a.dtype(), b.dtype(), c.dtype()])?;
    match plan(&rt.gpu.caps.facts, a.into(), b.into(), c.into(), opts)? {
        Some(p) => launch(rt, &p, a, b, c, opts),
        None => Ok(()),
    }
}

/// Launches `plan` (made for these operands): the product, or its K slices into
/// partials (`opts.scratch` where it is large enough, else a new block) and their sum
/// through the epilogue.
pub fn launch(rt: &Runtime, plan: &MatmulPlan, a: &Tensor, b: &Tensor, c: &Tensor, opts: &MatmulOptions) -> Result<(), Error> {
    if plan.splits == 1 {
        return launch_product(rt, &plan.kernel, &plan.params, a, b, c, opts.bias, plan.batches);
    }
    let (m, n, splits) = (plan.params.m as usize, plan.params.n as usize, plan.splits);
    let need = plan.scratch_elems;
    let parts = match opts.scratch {
        Some(t) if t.dtype() == DType::F32 && t.is_contiguous() && t.numel() >= need => {
            t.reshape(&[t.numel()])?.slice(0, 0, need)?.reshape(&[splits, m, n])?
        }
        _ => Tensor::empty(rt, &[splits, m, n], DType::F32, Category::Temporary, "matmul.splitk")?,
    };
    let first = Params {
        c_off: parts.offset() as u32,
        ..plan.first
    };
    launch_product(rt, &plan.kernel, &first, a, b, &parts, None, splits as u32)?;
    if plan.tc == DType::F32 && plan.activation == Activation::Identity && opts.bias.is_none() {
        // A plain f32 sum (weight gradients) is held back to go with other sums
        // (`kernels::col_sums`): the slices in order, then alpha and beta as the
        // epilogue applies them.
        let params = plan.params;
        return col_sums::defer(
            rt,
            col_sums::Sum {
                src: parts.clone(),
                s_off: parts.offset(),
                s_rs: m * n,
                parts: splits,
                lanes: 1,
                len: m * n,
                n,
                dst: c.clone(),
                d_off: params.c_off as usize,
                d_rs: params.c_rs as usize,
                alpha: params.alpha,
                beta: params.beta,
            },
        );
    }
    // Four elements a thread where a row's quads are aligned in C and in the partials.
    let params = plan.params;
    let quads = n.is_multiple_of(4) && parts.offset() == 0 && params.c_off.is_multiple_of(4) && params.c_rs.is_multiple_of(4);
    let second = Params {
        flags: u32::from(quads),
        ..params
    };
    let (tc, act) = (plan.tc, plan.activation);
    let kernel = rt.kernel(
        KernelKey::new("matmul_splitk", &[tc as u32, act as u32]),
        5,
        || split_name(tc, act),
        || render("matmul_splitk", SPLIT_SOURCE, &split_variant(tc, act)),
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

/// One product launch of `kernel` with `params` over `batches`.
#[allow(clippy::too_many_arguments)]
fn launch_product(
    rt: &Runtime,
    kernel: &ProductKernel,
    params: &Params,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    batches: u32,
) -> Result<(), Error> {
    let t = match kernel {
        ProductKernel::Coop(k) => return launch_coop(rt, k, params, a, b, c, bias, batches),
        ProductKernel::Tiled(t) => *t,
    };
    let (m, n, k) = (params.m as usize, params.n as usize, params.k as usize);
    let tile = t.tile() as usize;
    let [la, lb] = t.loads;
    let compiled = rt.kernel(
        KernelKey::new(
            "matmul",
            &[
                t.dtypes[0] as u32,
                t.dtypes[1] as u32,
                t.dtypes[2] as u32,
                t.tm,
                t.activation as u32,
                la.code() | lb.code() << 8 | u32::from(t.whole) << 16,
                t.simt.packed(),
            ],
        ),
        4,
        || t.to_string(),
        || render("matmul", SOURCE, &variant(t.dtypes, t.tm, t.simt, t.activation, t.loads, t.whole)),
    )?;
    // Without a bias, any block fills the (unread) bias binding.
    let bias = bias.unwrap_or(c);
    // A sliced launch's batches share the one product's K.
    let products = if params.flags & SLICED != 0 { 1 } else { batches };
    rt.launch_with_work(
        &compiled,
        bytemuck::bytes_of(params),
        &[a, b, c, bias],
        [n.div_ceil(tile) as u32, m.div_ceil(tile) as u32, batches],
        Some(2.0 * (m * n * k) as f64 * f64::from(products)),
        2,
    )
}

/// One launch of the tensor-core kernel `k` (shaders/matmul_coop.wgsl).
#[allow(clippy::too_many_arguments)]
fn launch_coop(
    rt: &Runtime,
    k: &CoopKernel,
    params: &Params,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    bias: Option<&Tensor>,
    batches: u32,
) -> Result<(), Error> {
    let k = *k;
    let [la, lb] = k.loads;
    let tile = k.tile;
    let compiled = rt.kernel(
        KernelKey::new(
            "matmul_coop",
            &[
                k.tc as u32,
                k.activation as u32,
                la.code(),
                lb.code(),
                tile.packed(),
                u32::from(k.whole) | u32::from(k.plain) << 1,
            ],
        ),
        5,
        || k.to_string(),
        || super::matmul_coop::source(k.tc, k.activation, (la, lb), tile, k.whole, k.plain),
    )?;
    let mut params = *params;
    let sliced = params.flags & SLICED;
    params.flags = sliced | u32::from(super::matmul_coop::wide(&params));
    let bias = bias.unwrap_or(c);
    // A sliced launch's batches share the one product's K.
    let products = if sliced != 0 { 1 } else { batches };
    let flops = 2.0 * f64::from(params.m) * f64::from(params.n) * f64::from(params.k) * f64::from(products);
    // C is bound twice: one element an entry (ragged tiles) and four (whole tiles).
    rt.launch_with_work(
        &compiled,
        bytemuck::bytes_of(&params),
        &[a, b, c, bias, c],
        [params.n.div_ceil(tile.bn()), params.m.div_ceil(tile.bm()), batches],
        Some(flops),
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
    let shape = output_shape(a.shape(), b.shape())?;
    let c = Tensor::empty(rt, &shape, dtype, category, label)?;
    matmul_into(rt, a, b, &c, opts)?;
    Ok(c)
}
