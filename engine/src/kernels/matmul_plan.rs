//! The matmul's plan: a pure function of the operands' shapes, strides, offsets and
//! types, the caller's options and the adapter's facts that validates the product and
//! chooses its kernel (tensor cores or the register-tiled SIMT kernel), the tile, the
//! operands' loads, split-K and the scratch its partials take. `kernels::matmul`
//! launches a plan; nothing here needs a GPU, so `tests/kernel_plans.rs` checks the
//! choices for described adapters. A plan's `Display` is the kernel's name in the
//! profiler's table and trace.
//!
//! May call: `device` (adapter facts), `error`, `kernels::{matmul_coop, matmul_params,
//! matmul_split}`, `tensor`.

use std::fmt;

use super::matmul_coop::{self as coop, TILE_128_AHEAD, TILE_128_SLIM};
use super::matmul_params::{Activation, Load, MatmulOptions, MatmulTile, Params, SLICE_UNIT, SLICED, SimtTile, wave_fill};
pub use super::matmul_split::{split_cost, split_k, split_k_by_waves, split_k_coop, split_k_tiled, tiled_split_cost};
use crate::device::AdapterFacts;
use crate::error::Error;
use crate::tensor::{DType, Tensor};

/// Vector width a misaligned product's tail split aligns to (the widest operand load;
/// `kernels::matmul::matmul_into`).
pub const ALIGN: usize = 8;

/// What a plan reads of a tensor: its view, not its memory.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    /// Sizes, outermost first.
    pub shape: &'a [usize],
    /// Element strides.
    pub strides: &'a [usize],
    /// Element offset into its block.
    pub offset: usize,
    /// Element type.
    pub dtype: DType,
}

impl<'a> From<&'a Tensor> for Operand<'a> {
    fn from(t: &'a Tensor) -> Self {
        Operand {
            shape: t.shape(),
            strides: t.strides(),
            offset: t.offset(),
            dtype: t.dtype(),
        }
    }
}

/// The register-tiled (SIMT) kernel of a launch: its types, thread tile (TM x TM of
/// 16 x 16 threads), variant, epilogue, operand loads and whether the loads skip bounds
/// checks (whole tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledKernel {
    /// A, B and C.
    pub dtypes: [DType; 3],
    /// Rows and columns a thread owns.
    pub tm: u32,
    /// The variant.
    pub simt: SimtTile,
    /// The epilogue.
    pub activation: Activation,
    /// How A and B are loaded.
    pub loads: [Load; 2],
    /// Whole tiles: loads without bounds checks.
    pub whole: bool,
}

impl TiledKernel {
    /// Rows (= columns) of C per workgroup.
    pub fn tile(&self) -> u32 {
        16 * self.tm
    }
}

/// The tensor-core kernel of a launch: C's type, the epilogue, loads, tile, whole tiles
/// and the PLAIN variant (no bias, activation, scale or accumulation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopKernel {
    /// C's type.
    pub tc: DType,
    /// The epilogue.
    pub activation: Activation,
    /// How A and B are loaded.
    pub loads: [Load; 2],
    /// The tile.
    pub tile: MatmulTile,
    /// Whole tiles: loads without bounds checks.
    pub whole: bool,
    /// No epilogue beyond the store.
    pub plain: bool,
}

/// The kernel a product (or the first pass of a split one) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductKernel {
    /// shaders/matmul.wgsl.
    Tiled(TiledKernel),
    /// shaders/matmul_coop.wgsl.
    Coop(CoopKernel),
}

impl ProductKernel {
    /// Rows and columns of C per workgroup.
    pub fn tile_mn(&self) -> (u32, u32) {
        match self {
            ProductKernel::Tiled(t) => (t.tile(), t.tile()),
            ProductKernel::Coop(t) => (t.tile.bm(), t.tile.bn()),
        }
    }
}

/// A validated product and every choice its launch makes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulPlan {
    /// The whole product's launch parameters (the split-K second pass's, when split).
    pub params: Params,
    /// The product's batches (B1 x B2).
    pub batches: u32,
    /// The first pass's parameters: the product itself, or its K slices into the
    /// partials (`c_off` is the partials' offset, set at launch).
    pub first: Params,
    /// The first pass's kernel.
    pub kernel: ProductKernel,
    /// K slices (1: not split).
    pub splits: usize,
    /// The split's partials in f32 elements (0 when not split).
    pub scratch_elems: usize,
    /// C's type and the epilogue of the second pass.
    pub tc: DType,
    /// The epilogue (the second pass's, when split).
    pub activation: Activation,
}

/// The plan of c = act(alpha * a @ b + bias + beta * c) on an adapter with `facts`, or
/// None when there is nothing to compute (an empty output).
pub fn plan(facts: &AdapterFacts, a: Operand, b: Operand, c: Operand, opts: &MatmulOptions) -> Result<Option<MatmulPlan>, Error> {
    let shape = output_shape(a.shape, b.shape)?;
    if c.shape != shape.as_slice() {
        return Err(Error::shape("matmul output", format!("{shape:?}"), format!("{:?}", c.shape)));
    }
    for (what, t) in [("a", a), ("b", b), ("c", c)] {
        if !t.dtype.is_float() {
            return Err(Error::shape(format!("matmul {what}"), "f32 or f16", t.dtype));
        }
    }
    let rc = c.shape.len();
    if c.strides[rc - 1] != 1 && c.shape[rc - 1] > 1 {
        return Err(Error::shape("matmul output", "contiguous rows", format!("strides {:?}", c.strides)));
    }
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
    let (_, sa) = batch_dims(a.shape, a.strides);
    let (_, sb) = batch_dims(b.shape, b.strides);
    let (dc, sc) = batch_dims(c.shape, c.strides);
    if let Some(bias) = opts.bias {
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
        return Ok(None);
    }
    if batches > 65535 {
        return Err(Error::shape("matmul", "at most 65535 batches", batches));
    }
    let params = Params {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        batch1: dc[1] as u32,
        a_off: a.offset as u32,
        a_rs: a.strides[ra - 2] as u32,
        a_cs: a.strides[ra - 1] as u32,
        a_bs0: sa[0] as u32,
        a_bs1: sa[1] as u32,
        b_off: b.offset as u32,
        b_rs: b.strides[rb - 2] as u32,
        b_cs: b.strides[rb - 1] as u32,
        b_bs0: sb[0] as u32,
        b_bs1: sb[1] as u32,
        c_off: c.offset as u32,
        c_rs: c.strides[rc - 2] as u32,
        c_bs0: sc[0] as u32,
        c_bs1: sc[1] as u32,
        bias_off: opts.bias.map_or(0, |t| t.offset() as u32),
        has_bias: opts.bias.is_some() as u32,
        alpha: opts.alpha,
        beta: opts.beta,
        flags: 0,
        splits: 1,
    };
    let wave = facts.wave();
    let usable = !opts.tiled_only && coop::eligible(facts.coop_f16, facts.subgroup_size, a.dtype, b.dtype, c.dtype);
    let coop_tile = usable.then(|| {
        opts.coop_tile
            .unwrap_or_else(|| coop::pick(m as u32, n as u32, batches as u32, wave))
    });
    let (tile_m, tile_n) = coop_tile.map_or_else(
        || (tiled_tile(facts, opts, m, n) as u64, tiled_tile(facts, opts, m, n) as u64),
        |t| (u64::from(t.bm()), u64::from(t.bn())),
    );
    let tiles = (m as u64).div_ceil(tile_m) * (n as u64).div_ceil(tile_n) * batches as u64;
    let wave_split = !usable && opts.simt_tile.unwrap_or(SimtTile::DEFAULT).wave_split;
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
                && [TILE_128_AHEAD, TILE_128_SLIM].iter().all(|&t| sliceable(&params, 1, t));
            slices(
                wave,
                (tiles, tile_m),
                k,
                batches,
                wave_split && !facts.cpu,
                wave_split,
                usable.then_some((a_col, uneven)),
            )
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
            Some(coop::by_waves(tiles * splits as u64, slice_len as u32, a_col, wave))
        }
        t => t,
    };
    if splits == 1 {
        let kernel = product_kernel(facts, &params, [a.dtype, b.dtype, c.dtype], coop_tile, opts)?;
        return Ok(Some(MatmulPlan {
            params,
            batches: batches as u32,
            first: params,
            kernel,
            splits,
            scratch_elems: 0,
            tc: c.dtype,
            activation: opts.activation,
        }));
    }
    // Split K: each slice's product into its own partial (the slices are the batches of
    // the first pass: its batch strides step along K), then the partials summed in order
    // through the epilogue. Where K is whole units of [`SLICE_UNIT`] (and, on the
    // tensor-core kernel, the tiles whole) the kernel takes uneven slices itself
    // (`SLICED`); other launches step along K by their batch strides, in equal slices.
    let sliced = match coop_tile {
        Some(t) => sliceable(&params, splits, t),
        None => tiled_sliceable(k, splits),
    };
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
        c_off: 0,
        c_rs: n as u32,
        c_bs0: (m * n) as u32,
        c_bs1: 0,
        bias_off: 0,
        has_bias: 0,
        alpha: 1.0,
        beta: 0.0,
        ..params
    };
    let partials = MatmulOptions {
        tiled_only: opts.tiled_only,
        coop_tile,
        simt_tile: opts.simt_tile,
        ..Default::default()
    };
    let kernel = product_kernel(facts, &first, [a.dtype, b.dtype, DType::F32], coop_tile, &partials)?;
    Ok(Some(MatmulPlan {
        params: Params {
            splits: splits as u32,
            ..params
        },
        batches: batches as u32,
        first,
        kernel,
        splits,
        scratch_elems: splits * m * n,
        tc: c.dtype,
        activation: opts.activation,
    }))
}

/// The kernel that runs `params`: tensor cores with `coop_tile` where it is set, else
/// the tiled kernel; the tile's fit to the adapter checked.
fn product_kernel(
    facts: &AdapterFacts,
    params: &Params,
    [ta, tb, tc]: [DType; 3],
    coop_tile: Option<MatmulTile>,
    opts: &MatmulOptions,
) -> Result<ProductKernel, Error> {
    let limit = facts.workgroup_bytes;
    if let Some(tile) = coop_tile {
        if !(tile.ahead == 1 || tile.ahead == 2 && tile.nbuf == 1) {
            return Err(Error::invalid(
                "matmul tile",
                format!("{}: two K tiles in flight take one buffer", tile.name()),
            ));
        }
        if coop::workgroup_bytes(tile) > limit || tile.threads() > 1024 {
            return Err(Error::invalid(
                "matmul tile",
                format!(
                    "{} needs {} bytes of workgroup memory (the adapter has {limit})",
                    tile.name(),
                    coop::workgroup_bytes(tile)
                ),
            ));
        }
        let whole = coop::whole(params, tile);
        if params.flags & SLICED != 0 && !whole {
            return Err(Error::invalid(
                "matmul K slices",
                format!("uneven K slices take whole tiles of {}", tile.name()),
            ));
        }
        return Ok(ProductKernel::Coop(CoopKernel {
            tc,
            activation: opts.activation,
            loads: Load::of_operands(params, &[8, 4]),
            tile,
            whole,
            plain: coop::plain(opts),
        }));
    }
    let (m, n, k) = (params.m as usize, params.n as usize, params.k as usize);
    let tm = (tiled_tile(facts, opts, m, n) / 16) as u32;
    let loads = Load::of_operands(params, &[4]);
    let simt = opts.simt_tile.unwrap_or(SimtTile::DEFAULT);
    if !matches!(simt.tm, 0 | 4 | 8) {
        return Err(Error::invalid("matmul", format!("{}: a thread tile of 4 or 8", simt.name())));
    }
    if simt.workgroup_bytes(tm) > limit {
        return Err(Error::invalid(
            "matmul",
            format!(
                "a tiled variant within the adapter's {limit} bytes of workgroup memory ({} needs {})",
                simt.name(),
                simt.workgroup_bytes(tm)
            ),
        ));
    }
    Ok(ProductKernel::Tiled(TiledKernel {
        dtypes: [ta, tb, tc],
        tm,
        simt,
        activation: opts.activation,
        loads,
        whole: whole_tiles(m, n, k, tm, simt.bk, loads),
    }))
}

/// Batch sizes and strides of a [.., R, C] view, padded to two batch dims.
fn batch_dims(shape: &[usize], strides: &[usize]) -> ([usize; 2], [usize; 2]) {
    let rank = shape.len();
    let mut dims = [1usize; 2];
    let mut out = [0usize; 2];
    for i in 0..rank.saturating_sub(2) {
        let slot = 2 - (rank - 2) + i;
        dims[slot] = shape[i];
        out[slot] = if shape[i] == 1 { 0 } else { strides[i] };
    }
    (dims, out)
}

/// Shape of the product of a [.., M, K] and b [.., K, N] (batch dims broadcast).
pub fn output_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>, Error> {
    let (ra, rb) = (a.len(), b.len());
    if !(2..=4).contains(&ra) || !(2..=4).contains(&rb) {
        return Err(Error::shape("matmul", "operands of rank 2 to 4", format!("{a:?} and {b:?}")));
    }
    let (m, k) = (a[ra - 2], a[ra - 1]);
    let (k2, n) = (b[rb - 2], b[rb - 1]);
    if k != k2 {
        return Err(Error::shape("matmul", "equal inner dimensions", format!("{a:?} and {b:?}")));
    }
    // Broadcasting looks at the sizes only.
    let (da, _) = batch_dims(a, a);
    let (db, _) = batch_dims(b, b);
    let mut batch = Vec::new();
    for i in 0..2 {
        if da[i] != db[i] && da[i] != 1 && db[i] != 1 {
            return Err(Error::shape(
                "matmul",
                "batch dimensions that broadcast",
                format!("{a:?} and {b:?}"),
            ));
        }
        batch.push(da[i].max(db[i]));
    }
    let lead = ra.max(rb) - 2;
    let mut shape: Vec<usize> = batch[2 - lead..].to_vec();
    shape.extend([m, n]);
    Ok(shape)
}

/// Whether an `m` x `n` x `k` product covers whole tiles of the tiled kernel with TM
/// `tm` and K by `bk`, with both operands' rows contiguous and loaded as vec4s (`la`,
/// `lb`): then its variant loads without bounds checks. (With a transposed view among
/// the operands the unchecked loads were slower on the H100: GPT-2's dX products 25%
/// slower, its forward products 1-24% faster; CHANGELOG.md.)
pub fn whole_tiles(m: usize, n: usize, k: usize, tm: u32, bk: u32, [la, lb]: [Load; 2]) -> bool {
    let (bm, bk) = (16 * tm as usize, bk as usize);
    la.vec4_rows() && lb.vec4_rows() && m.is_multiple_of(bm) && n.is_multiple_of(bm) && k.is_multiple_of(bk) && k > 0
}

/// Whether the tensor-core kernel with `tile` can take this product in `splits` uneven K
/// slices (`SLICED`): K a multiple of [`SLICE_UNIT`], a unit at least a slice, and whole
/// tiles (the loads are unchecked, so no slice reads into the next).
fn sliceable(params: &Params, splits: usize, tile: MatmulTile) -> bool {
    let k = params.k as usize;
    let all = Params { flags: SLICED, ..*params };
    k.is_multiple_of(SLICE_UNIT) && splits <= k / SLICE_UNIT && coop::whole(&all, tile)
}

/// Whether the tiled kernel can take a product of inner size `k` in `splits` uneven K
/// slices (`SLICED`): K a multiple of [`SLICE_UNIT`], a unit at least a slice. (Its
/// loads check M and N, and within a slice K, whose length is whole K tiles.)
fn tiled_sliceable(k: usize, splits: usize) -> bool {
    splits > 1 && k.is_multiple_of(SLICE_UNIT) && splits <= k / SLICE_UNIT
}

/// K slices of a product of `tiles` output tiles (over all `batches`) and inner size
/// `k` on a device whose wave holds `wave` workgroups: for the tiled kernel's wave-split
/// variants on a GPU (`modelled`) [`split_k_tiled`] where K is whole units of
/// [`SLICE_UNIT`] (the tile's side in `tiles`), else by wave fill (a CPU adapter's
/// threads are not the model's SMs: on lavapipe it split a small MLP's products the wave
/// rule leaves whole, 4.00 -> 4.76 MiB at no speed); [`split_k_coop`] for the tensor-core kernel (`coop`:
/// whether A is a transposed view, and whether uneven slices may be taken), else
/// [`split_k`]; a batched product is not split.
fn slices(
    wave: u64,
    (tiles, tile): (u64, u64),
    k: usize,
    batches: usize,
    modelled: bool,
    wave_split: bool,
    coop: Option<(bool, bool)>,
) -> usize {
    match (batches, coop) {
        (1, None) if modelled && k.is_multiple_of(SLICE_UNIT) => split_k_tiled(wave, (tiles, tile), k),
        (1, _) if wave_split => split_k_by_waves(wave, tiles, k),
        (1, Some((a_col, uneven))) => split_k_coop(wave, tiles, k, a_col, uneven),
        (1, None) => split_k(wave, tiles, k),
        _ => 1,
    }
}

/// Bytes of split-K partials that the tiled kernel's default variant allocates for a
/// product [m, k] @ [k, n] (0 when it does not split) on an adapter with `facts`: what a
/// caller sizing its own blocks around such a product leaves room for. An upper bound:
/// a K off the load alignment may be split into its aligned bulk and the rest
/// (`kernels::matmul::matmul_into`), and either may be what is launched.
pub fn tiled_split_bytes(facts: &AdapterFacts, m: usize, n: usize, k: usize) -> u64 {
    let t = tiled_tile(facts, &MatmulOptions::default(), m, n);
    let tiles = (m.div_ceil(t) * n.div_ceil(t)) as u64;
    let align = ALIGN;
    let bulk = if k > align { k - k % align } else { k };
    let wave_split = SimtTile::DEFAULT.wave_split;
    let wave = facts.wave();
    let tiles = (tiles, t as u64);
    let modelled = wave_split && !facts.cpu;
    match slices(wave, tiles, k, 1, modelled, wave_split, None).max(slices(wave, tiles, bulk, 1, modelled, wave_split, None)) {
        1 => 0,
        s => (s * m * n * 4) as u64,
    }
}

/// The tiled kernel's output tile (rows = columns): 128 where both sides reach it, but
/// 64 on CPU adapters, where the larger tile ran no faster (lavapipe: 8x8 registers a
/// thread 0.6-0.7 GFLOP/s, 4x4 0.4-0.6) and took its compiler 1.7-7.6 s against 0.2;
/// or the variant's own (`SimtTile::tm`, forced).
fn tiled_tile(facts: &AdapterFacts, opts: &MatmulOptions, m: usize, n: usize) -> usize {
    match opts.simt_tile.map_or(0, |t| t.tm) {
        0 if m >= 128 && n >= 128 && !facts.cpu => 128,
        0 => 64,
        tm => 16 * tm as usize,
    }
}

/// The share of the device's slots a product of `tiles` workgroups keeps busy over its
/// waves (for reports).
pub fn fill(facts: &AdapterFacts, workgroups: u64) -> f64 {
    wave_fill(workgroups, facts.wave())
}

fn dtype(t: DType) -> &'static str {
    t.wgsl()
}

fn load(l: Load) -> String {
    format!("{}{}", if l.col { "col" } else { "row" }, l.width)
}

/// The name the profiler gives the kernel: `matmul f16,f16->f32 tm8 gelu a:row4 b:col4`.
impl fmt::Display for TiledKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [ta, tb, tc] = self.dtypes;
        write!(
            f,
            "matmul {},{}->{} tm{}{} a:{} b:{}",
            dtype(ta),
            dtype(tb),
            dtype(tc),
            self.tm,
            activation(self.activation),
            load(self.loads[0]),
            load(self.loads[1])
        )
    }
}

/// `matmul_coop f16,f16->f32 gelu a:row8 b:col8 128x128 k64 x1 a2 256t`.
impl fmt::Display for CoopKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.tile;
        write!(
            f,
            "matmul_coop f16,f16->{}{} a:{} b:{} {}x{} k{} x{}{} {}t",
            dtype(self.tc),
            activation(self.activation),
            load(self.loads[0]),
            load(self.loads[1]),
            t.bm(),
            t.bn(),
            t.bk,
            t.nbuf,
            if t.ahead == 2 { " a2" } else { "" },
            t.threads()
        )
    }
}

impl fmt::Display for ProductKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProductKernel::Tiled(k) => k.fmt(f),
            ProductKernel::Coop(k) => k.fmt(f),
        }
    }
}

/// The product's kernel, and its split when split: `... split 3 (sum ->f32)`.
impl fmt::Display for MatmulPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kernel)?;
        if self.splits > 1 {
            write!(f, " split {} (sum ->{})", self.splits, dtype(self.tc))?;
        }
        Ok(())
    }
}

/// The split-K second pass's name.
pub fn split_name(tc: DType, act: Activation) -> String {
    format!("matmul split-K sum ->{}{}", dtype(tc), activation(act))
}

fn activation(a: Activation) -> &'static str {
    match a {
        Activation::Identity => "",
        Activation::Relu => " relu",
        Activation::Gelu => " gelu",
    }
}
