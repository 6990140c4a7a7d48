//! What the tiled and the cooperative-matrix matmuls share: the epilogue's activation,
//! the options of a matmul, the launch parameters (one layout for both WGSL kernels,
//! `shaders/matmul_common.wgsl`), and the rule for vec4 tile loads.
//!
//! May call: `tensor`. Called by: `kernels::{matmul, matmul_coop}`.

use bytemuck::{Pod, Zeroable};

use crate::tensor::Tensor;

/// Parameters, output bindings and epilogue shared with the cooperative kernel.
pub const COMMON: &str = include_str!("../../../shaders/matmul_common.wgsl");

/// The epilogue's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// max(v, 0)
    Relu,
    /// GPT-2's gelu.
    Gelu,
}

impl Activation {
    /// The epilogue's WGSL expression in terms of `v`.
    pub fn expr(self) -> &'static str {
        match self {
            Activation::Identity => "v",
            Activation::Relu => "max(v, 0.0)",
            Activation::Gelu => "gelu(v)",
        }
    }
}

/// Scale, accumulation and epilogue of a matmul.
#[derive(Clone, Copy, Debug)]
pub struct MatmulOptions<'a> {
    /// C = alpha * A @ B + ...
    pub alpha: f32,
    /// ... + beta * C (0 overwrites C).
    pub beta: f32,
    /// A row vector [N] (f32) added to every row.
    pub bias: Option<&'a Tensor>,
    /// Applied last.
    pub activation: Activation,
    /// Use the tiled kernel even where the cooperative one would be chosen.
    pub tiled_only: bool,
    /// The cooperative kernel's tile, where the caller forces one (the tuning sweep);
    /// `None` lets the shape pick.
    pub coop_tile: Option<MatmulTile>,
    /// The tiled kernel's variant, where the caller forces one (the tuning sweep);
    /// `None` takes [`SimtTile::DEFAULT`].
    pub simt_tile: Option<SimtTile>,
    /// K slices, where the caller forces them (the tuning sweep, `wgtrain bench
    /// --splits`); `None` lets the shape pick. 1 does not split.
    pub split_k: Option<usize>,
    /// Memory that is dead during the product (contiguous f32), where split-K keeps its
    /// partials when they fit, instead of a new block: a caller whose peak the partials
    /// would raise lends it.
    pub scratch: Option<&'a Tensor>,
}

/// A variant of the tiled (SIMT) kernel, shaders/matmul.wgsl: `square` places a warp's
/// lanes on 8 x 4 thread tiles (else 16 x 2), `nbuf` workgroup buffers per operand (2:
/// one barrier per K tile instead of two), K tiles of `bk` (16 or 32), `unroll` writes a
/// K tile's steps out; `wave_split` picks a product's split-K by how evenly its
/// workgroups fill the device's waves (else: the fewest slices that fill it twice);
/// `tm` forces the rows and columns a thread owns (4 or 8; 0: the shape and adapter
/// pick, `kernels::matmul_plan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimtTile {
    pub square: bool,
    pub nbuf: u32,
    pub bk: u32,
    pub unroll: bool,
    pub wave_split: bool,
    pub tm: u32,
}

impl SimtTile {
    /// The kernel's first version: 16 x 2 lanes per warp, a K loop, one buffer, the
    /// fewest slices that fill the device twice.
    pub const FIRST: SimtTile = SimtTile {
        square: false,
        nbuf: 1,
        bk: 16,
        unroll: false,
        wave_split: false,
        tm: 0,
    };

    /// What the tiled kernel runs unless told otherwise: the fastest of
    /// [`SimtTile::candidates`] on the H100 at 4096^3 and at GPT-2's products
    /// (CHANGELOG.md).
    pub const DEFAULT: SimtTile = SimtTile {
        square: true,
        nbuf: 1,
        bk: 16,
        unroll: true,
        wave_split: true,
        tm: 0,
    };

    /// The variants `wgtrain bench --tune` sweeps: the first version, the default, and
    /// the default with two buffers, with K tiles of 32, or with the first split rule.
    pub fn candidates() -> Vec<SimtTile> {
        let d = SimtTile::DEFAULT;
        vec![
            SimtTile::FIRST,
            d,
            SimtTile { nbuf: 2, ..d },
            SimtTile { bk: 32, ..d },
            SimtTile { wave_split: false, ..d },
        ]
    }

    /// Workgroup memory of the variant with `tm` x `tm` thread tiles.
    pub const fn workgroup_bytes(&self, tm: u32) -> u64 {
        2 * self.nbuf as u64 * self.bk as u64 * 16 * tm as u64 * 4
    }

    /// One number for the kernel key (the split rule is not the kernel's).
    pub const fn packed(&self) -> u32 {
        self.square as u32 | self.nbuf << 1 | (self.unroll as u32) << 4 | self.bk << 5
    }

    /// `sq|wide _bN _kBK _unroll|loop [_w]`, as benchmark rows name it.
    pub fn name(&self) -> String {
        let lanes = if self.square { "sq" } else { "wide" };
        let k = if self.unroll { "unroll" } else { "loop" };
        let w = if self.wave_split { "_w" } else { "" };
        let tm = if self.tm > 0 { format!("_tm{}", self.tm) } else { String::new() };
        format!("{lanes}_b{}_k{}_{k}{w}{tm}", self.nbuf, self.bk)
    }
}

/// [`Params::flags`]' bit for a cooperative first pass in uneven K slices: batch z of the
/// launch takes slice z of `splits`, in whole units of [`SLICE_UNIT`] of K (each slice's
/// rounded share), `k` being the whole product's.
pub const SLICED: u32 = 2;
/// The K granule of uneven slices (shaders/matmul_common.wgsl's `SLICE_UNIT`): two K tiles
/// of 64, so every slice has an even count of them (the two-a-turn loop's whole tiles).
pub const SLICE_UNIT: usize = 128;

/// The share of busy slots over the waves `workgroups` take when `slots` run at once.
pub fn wave_fill(workgroups: u64, slots: u64) -> f64 {
    workgroups as f64 / (workgroups.div_ceil(slots) * slots) as f64
}

/// The tile of a cooperative-matrix matmul variant: `gm` x `gn` subgroups of 32, each
/// owning `fm` x `fn_` 16 x 16 fragments of C; K steps by `bk` through `nbuf` (1 or 2)
/// workgroup buffers per operand, with `ahead` (1 or 2; 2 only with one buffer) K tiles
/// in flight from global memory in each thread's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulTile {
    pub gm: u32,
    pub gn: u32,
    pub fm: u32,
    pub fn_: u32,
    pub bk: u32,
    pub nbuf: u32,
    pub ahead: u32,
}

impl MatmulTile {
    /// GM x GN subgroups of FM x FN fragments, K by BK through NBUF buffers.
    pub const fn new(gm: u32, gn: u32, fm: u32, fn_: u32, bk: u32, nbuf: u32) -> MatmulTile {
        MatmulTile {
            gm,
            gn,
            fm,
            fn_,
            bk,
            nbuf,
            ahead: 1,
        }
    }

    /// The same tile with two K tiles in flight in registers (one buffer).
    pub const fn two_ahead(self) -> MatmulTile {
        MatmulTile { ahead: 2, ..self }
    }

    /// Whether the K loop takes two tiles a turn (two buffers or two tiles ahead).
    pub const fn pairs(&self) -> bool {
        self.nbuf == 2 || self.ahead == 2
    }

    /// Rows of C per workgroup.
    pub const fn bm(&self) -> u32 {
        self.gm * self.fm * 16
    }

    /// Columns of C per workgroup.
    pub const fn bn(&self) -> u32 {
        self.gn * self.fn_ * 16
    }

    /// Invocations per workgroup.
    pub const fn threads(&self) -> u32 {
        self.gm * self.gn * 32
    }

    /// One number for the kernel key.
    pub const fn packed(&self) -> u32 {
        self.gm | self.gn << 4 | self.fm << 8 | self.fn_ << 12 | self.bk << 16 | self.nbuf << 24 | self.ahead << 28
    }

    /// `gm x gn x fm x fn x bk x nbuf`, and `a2` with two K tiles in flight, as benchmark
    /// rows name it.
    pub fn name(&self) -> String {
        let ahead = if self.ahead > 1 { "a2" } else { "" };
        format!("{}x{}x{}x{}x{}x{}{ahead}", self.gm, self.gn, self.fm, self.fn_, self.bk, self.nbuf)
    }
}

/// Which matmul kernel a benchmark row runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulVariant {
    /// Whatever the shape and adapter pick.
    Auto,
    /// The tiled kernel, its default variant.
    Tiled,
    /// The cooperative kernel with this tile.
    Coop(MatmulTile),
    /// The tiled kernel with this variant.
    Simt(SimtTile),
}

impl MatmulVariant {
    /// The options that run it.
    pub fn options(self) -> MatmulOptions<'static> {
        let base = MatmulOptions::default();
        match self {
            MatmulVariant::Auto => base,
            MatmulVariant::Tiled => MatmulOptions { tiled_only: true, ..base },
            MatmulVariant::Coop(t) => MatmulOptions {
                coop_tile: Some(t),
                ..base
            },
            MatmulVariant::Simt(t) => MatmulOptions {
                tiled_only: true,
                simt_tile: Some(t),
                ..base
            },
        }
    }

    /// `tune.NAME.` for a forced variant, as the sweep's rows begin; empty otherwise.
    pub fn row_prefix(self) -> String {
        match self {
            MatmulVariant::Auto | MatmulVariant::Tiled => String::new(),
            MatmulVariant::Coop(t) => format!("tune.{}.", t.name()),
            MatmulVariant::Simt(t) => format!("tune.f32.{}.", t.name()),
        }
    }
}

impl Default for MatmulOptions<'_> {
    fn default() -> Self {
        MatmulOptions {
            alpha: 1.0,
            beta: 0.0,
            bias: None,
            activation: Activation::Identity,
            tiled_only: false,
            coop_tile: None,
            simt_tile: None,
            split_k: None,
            scratch: None,
        }
    }
}

/// Launch parameters of both matmul kernels (`Params` in shaders/matmul_common.wgsl):
/// sizes, element offsets and strides of A, B and C, the bias, alpha and beta.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable, Default)]
pub struct Params {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch1: u32,
    pub a_off: u32,
    pub a_rs: u32,
    pub a_cs: u32,
    pub a_bs0: u32,
    pub a_bs1: u32,
    pub b_off: u32,
    pub b_rs: u32,
    pub b_cs: u32,
    pub b_bs0: u32,
    pub b_bs1: u32,
    pub c_off: u32,
    pub c_rs: u32,
    pub c_bs0: u32,
    pub c_bs1: u32,
    pub bias_off: u32,
    pub has_bias: u32,
    pub alpha: f32,
    pub beta: f32,
    /// Bit 0: the cooperative kernel may store whole tiles four elements at once (C's
    /// offset and strides multiples of 4; the split-K second pass: likewise, with N).
    /// Bit 1: the first pass of a split product in uneven K slices ([`SLICED`]), in
    /// either kernel (the tiled kernel ignores bit 0).
    pub flags: u32,
    /// K slices of a split-K matmul (its second pass sums this many partials; with
    /// [`SLICED`], the first pass's slices).
    pub splits: u32,
}

/// How the kernel reads one operand: `col` when it is contiguous down its columns
/// rather than along its rows (a transposed view), and the width of its global loads in
/// halves (8, 4 or 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Load {
    pub col: bool,
    pub width: u32,
}

impl Load {
    /// The load of a `rows` x `cols` operand (A: M x K, B: K x N) with row and column
    /// strides `rs`, `cs`, element offset `off` and batch strides `bs`: the first of
    /// `widths` that the alignment allows, else 1.
    pub fn of(rs: u32, cs: u32, off: u32, bs: [u32; 2], rows: u32, cols: u32, widths: &[u32]) -> Load {
        let width = |stride: u32, len: u32| {
            widths
                .iter()
                .copied()
                .find(|w| [off, stride, bs[0], bs[1], len].iter().all(|v| v % w == 0))
                .unwrap_or(1)
        };
        if cs == 1 {
            Load {
                col: false,
                width: width(rs, cols),
            }
        } else if rs == 1 {
            Load {
                col: true,
                width: width(cs, rows),
            }
        } else {
            Load { col: false, width: 1 }
        }
    }

    /// The loads of both operands of a launch.
    pub fn of_operands(p: &Params, widths: &[u32]) -> [Load; 2] {
        [
            Load::of(p.a_rs, p.a_cs, p.a_off, [p.a_bs0, p.a_bs1], p.m, p.k, widths),
            Load::of(p.b_rs, p.b_cs, p.b_off, [p.b_bs0, p.b_bs1], p.k, p.n, widths),
        ]
    }

    /// One number for a kernel key.
    pub fn code(self) -> u32 {
        u32::from(self.col) | self.width << 1
    }

    /// Whether the operand's rows are contiguous and loaded as vec4s (the tiled kernel's
    /// whole-tile variant takes only these).
    pub fn vec4_rows(self) -> bool {
        !self.col && self.width == 4
    }
}
