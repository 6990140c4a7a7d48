//! Every template variant the runtime can ask for, rendered, so that one test can
//! validate them all with naga (`tests/kernel_variants.rs`) without a GPU.
//!
//! May call: `error`, `kernels::cross_entropy`, `kernels::embedding`,
//! `kernels::flash_attention`, `kernels::flash_attention_coop`, `kernels::flash_attention_tiled`,
//! `kernels::layernorm`, `kernels::map`, `kernels::matmul`, `kernels::matmul_coop`,
//! `kernels::{optim, optim_multi}`, `kernels::{col_sums, reduce}`, `kernels::{batchnorm, conv, pool}`, `kernels::softmax`, `runtime`, `tensor`.

use super::attention_plan::{LaneKernel, Mode, Path};
use super::flash_attention_coop::{self, AttentionTile, CoopMode};
use super::flash_attention_tiled::{self, TiledMode, TiledTile};
use super::map::MapOp;
use super::matmul::Activation;
use super::matmul_coop::{self, CANDIDATES, TILE_128_K64};
use super::matmul_params::{Load, SimtTile};
use super::reduce::ReduceOp;
use super::softmax::SoftmaxMode;
use crate::error::Error;
use crate::runtime::render;
use crate::tensor::DType;

/// A rendered variant: kernel name, template values, WGSL.
pub struct Variant {
    /// The kernel family.
    pub name: &'static str,
    /// Its template values, for messages.
    pub values: String,
    /// The rendered WGSL.
    pub wgsl: String,
}

fn push(out: &mut Vec<Variant>, name: &'static str, source: &str, values: Vec<(&'static str, String)>) -> Result<(), Error> {
    let wgsl = render(name, source, &values)?;
    out.push(Variant {
        name,
        // Short values only: pasted sources (common code, operands) would drown the rest.
        values: format!("{:?}", values.iter().filter(|(_, v)| v.len() <= 60).collect::<Vec<_>>()),
        wgsl,
    });
    Ok(())
}

/// Renders every variant.
pub fn all() -> Result<Vec<Variant>, Error> {
    let mut out = Vec::new();
    let floats = [DType::F32, DType::F16];
    for op in MapOp::ALL {
        for ta in floats {
            for to in floats {
                for lanes in [1, 4] {
                    push(
                        &mut out,
                        "map",
                        include_str!("../../../shaders/map.wgsl"),
                        super::map::variant(op, ta, ta, to, lanes),
                    )?;
                }
            }
        }
    }
    push(
        &mut out,
        "map",
        include_str!("../../../shaders/map.wgsl"),
        super::map::variant(MapOp::Copy, DType::I32, DType::I32, DType::F32, 1),
    )?;
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        for t in floats {
            push(
                &mut out,
                "reduce",
                include_str!("../../../shaders/reduce.wgsl"),
                super::reduce::variant(op, t),
            )?;
        }
    }
    for mode in Mode::ALL {
        for tq in floats {
            for td in floats {
                for (d4, bc) in [(1, 64), (2, 64), (3, 64), (4, 64), (8, 32), (16, 16), (32, 8)] {
                    // Path::Tiled differs from Subgroup only in dK dV (two key rows a thread).
                    let tiled = (mode == Mode::KeyValue).then_some(Path::Tiled);
                    for path in [Path::Plain, Path::Subgroup].into_iter().chain(tiled) {
                        for unroll in [false, true] {
                            out.push(Variant {
                                name: "flash_attention",
                                values: format!("mode {} {tq:?} dy {td:?} d4 {d4} tile {bc} {path:?} unroll {unroll}", mode as u32),
                                wgsl: super::flash_attention::source(&LaneKernel::new(path, d4, mode, bc, unroll), tq, td)?,
                            });
                        }
                    }
                }
            }
        }
    }
    // The register-tiled attention: every mode, type pair and head size it takes, with
    // each tile of the sweep that it takes there, with and without prefetch, written out
    // and as loops of 1, 2 and 4 chunks.
    for mode in [TiledMode::Forward, TiledMode::KeyValue, TiledMode::Query] {
        for tq in floats {
            for td in floats {
                for d4 in [8, 16, 32] {
                    for tile in flash_attention_tiled::SWEEP.into_iter().filter(|t| t.valid(d4)) {
                        for tile in [TiledTile { prefetch: false, ..tile }, tile] {
                            for chunks in [0, 1, 2, 4] {
                                out.push(Variant {
                                    name: "flash_attention_tiled",
                                    values: format!("{mode:?} {tq:?} dy {td:?} d4 {d4} {tile:?} chunks {chunks}"),
                                    wgsl: flash_attention_tiled::source(mode, tq, td, d4, tile, chunks)?,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    // The tensor-core attention: every mode, dy type and head size, with the tile each
    // picks in 48 KiB (and the smallest).
    for mode in [CoopMode::Forward, CoopMode::KeyValue, CoopMode::Query] {
        for td in floats {
            for d in [16, 32, 64, 128] {
                let best = flash_attention_coop::pick(mode, d, 48 * 1024, true)
                    .ok_or_else(|| Error::invalid("flash attention variants", format!("no tile for head size {d}")))?;
                let small = AttentionTile {
                    sg: 1,
                    bc: 16,
                    subgroup_sync: !best.subgroup_sync,
                    prefetch: !best.prefetch,
                };
                for tile in [best, small] {
                    for whole in [false, true] {
                        out.push(Variant {
                            name: "flash_attention_coop",
                            values: format!("{mode:?} dy {td:?} d {d} {tile:?} whole {whole}"),
                            wgsl: flash_attention_coop::source(mode, td, d, tile, whole)?,
                        });
                    }
                }
            }
        }
    }
    for mode in [SoftmaxMode::Softmax, SoftmaxMode::LogSoftmax, SoftmaxMode::Backward] {
        for tx in floats {
            for ty in floats {
                // dy's dtype varies in backward only (forward binds x as dy).
                let tds: Vec<_> = if mode == SoftmaxMode::Backward { floats.to_vec() } else { vec![tx] };
                for td in tds {
                    push(
                        &mut out,
                        "softmax",
                        include_str!("../../../shaders/softmax.wgsl"),
                        super::softmax::variant(mode, tx, td, ty),
                    )?;
                }
            }
        }
    }
    for mode in [0, 1, 2, 4] {
        for t in floats {
            for norm in [super::layernorm::Norm::Layer, super::layernorm::Norm::Rms] {
                push(
                    &mut out,
                    "layernorm",
                    include_str!("../../../shaders/layernorm.wgsl"),
                    super::layernorm::variant(mode, t, norm),
                )?;
            }
        }
    }
    // f16 outputs, and fused with the residual add (forward) or the gradient so far
    // (backward), of f32 activations.
    for (mode, out_t, fused) in [
        (0, DType::F16, false),
        (0, DType::F16, true),
        (0, DType::F32, true),
        (1, DType::F32, true),
        (4, DType::F32, true),
    ] {
        push(
            &mut out,
            "layernorm",
            include_str!("../../../shaders/layernorm.wgsl"),
            super::layernorm::variant_fused(mode, DType::F32, out_t, super::layernorm::Norm::Layer, fused),
        )?;
    }
    // The subgroup-a-row kernels: lavapipe's 8 lanes, 32 (NVIDIA) and 64, rows from 4 to
    // 1,024 columns wide; forward of f32 rows to f32 or f16 (with the residual prologue),
    // backward with partials of f32 or f16 rows (with the gradient so far).
    use super::layernorm::{Norm, RowShape, rows_variant};
    for (sg, cols) in [(8, 1024), (32, 768), (32, 4), (64, 384)] {
        let shape = RowShape::of(true, (sg, sg), cols).expect("a shape the kernels take");
        for norm in [Norm::Layer, Norm::Rms] {
            for fused in [false, true] {
                for (mode, types) in [
                    (0, (DType::F32, DType::F32)),
                    (0, (DType::F32, DType::F16)),
                    (4, (DType::F32, DType::F32)),
                    (4, (DType::F16, DType::F16)),
                ] {
                    let source = include_str!("../../../shaders/layernorm_rows.wgsl");
                    push(&mut out, "layernorm_rows", source, rows_variant(mode, types, norm, fused, shape))?;
                }
            }
        }
    }
    for t in floats {
        for (mode, td) in [(0, t), (1, DType::F32)] {
            for rope in [false, true] {
                push(
                    &mut out,
                    "heads",
                    include_str!("../../../shaders/heads.wgsl"),
                    super::heads::variant(mode, t, td, rope),
                )?;
            }
        }
        for (backward, td) in [(false, t), (true, t), (true, DType::F16)] {
            for vec in [false, true] {
                push(
                    &mut out,
                    "cross_entropy",
                    include_str!("../../../shaders/cross_entropy.wgsl"),
                    super::cross_entropy::variant(t, backward, td, vec),
                )?;
            }
        }
        for mode in 0..5 {
            push(
                &mut out,
                "embedding",
                include_str!("../../../shaders/embedding.wgsl"),
                super::embedding::variant(mode, t),
            )?;
        }
    }
    for act in [Activation::Identity, Activation::Relu, Activation::Gelu] {
        for ta in floats {
            for tc in floats {
                for tm in [4, 8] {
                    let loads = [(false, 1), (false, 4), (true, 4)].map(|(col, width)| Load { col, width });
                    for la in loads {
                        for lb in loads {
                            // Whole tiles (loads unchecked) with the vector loads.
                            let vectors = la.vec4_rows() && lb.vec4_rows();
                            for whole in [false, true].into_iter().filter(|&w| !w || vectors) {
                                push(
                                    &mut out,
                                    "matmul",
                                    include_str!("../../../shaders/matmul.wgsl"),
                                    super::matmul::variant([ta, ta, tc], tm, SimtTile::DEFAULT, act, [la, lb], whole),
                                )?;
                            }
                        }
                    }
                }
            }
        }
    }
    // The tuning sweep's other variants, with f32 operands and each load.
    for tile in SimtTile::candidates() {
        for tm in [4, 8] {
            let loads = [(false, 1), (false, 4), (true, 4)].map(|(col, width)| Load { col, width });
            for (la, lb) in loads.into_iter().flat_map(|la| loads.map(|lb| (la, lb))) {
                push(
                    &mut out,
                    "matmul",
                    include_str!("../../../shaders/matmul.wgsl"),
                    super::matmul::variant(
                        [DType::F32; 3],
                        tm,
                        tile,
                        Activation::Identity,
                        [la, lb],
                        la.vec4_rows() && lb.vec4_rows(),
                    ),
                )?;
            }
        }
    }
    for act in [Activation::Identity, Activation::Relu, Activation::Gelu] {
        for tc in floats {
            push(
                &mut out,
                "matmul_splitk",
                include_str!("../../../shaders/matmul_splitk.wgsl"),
                super::matmul::split_variant(tc, act),
            )?;
        }
    }
    for t in floats {
        // Copies and activations' derivatives only of f32 x.
        // (copy, activation's derivative, its output written again)
        let fused: Vec<(Option<DType>, Option<(MapOp, DType)>, bool)> = if t == DType::F32 {
            let mut v = vec![(None, None, false), (Some(DType::F16), None, false)];
            for copy in floats.iter().copied() {
                for op in [MapOp::GeluBackward, MapOp::GeluErfBackward, MapOp::SiluBackward] {
                    v.push((Some(copy), Some((op, copy)), false));
                }
                for op in [MapOp::GeluBackward, MapOp::GeluErfBackward] {
                    v.push((Some(copy), Some((op, copy)), true));
                }
            }
            v
        } else {
            vec![(None, None, false)]
        };
        for (copy, act, again) in fused {
            for width in [1, 4] {
                push(
                    &mut out,
                    "sum_rows",
                    include_str!("../../../shaders/sum_rows.wgsl"),
                    super::reduce::sum_rows_variant(t, copy, act, again, width)?,
                )?;
            }
        }
    }
    for jobs in 1..=super::col_sums::MAX_JOBS {
        push(
            &mut out,
            "col_sums",
            include_str!("../../../shaders/col_sums.wgsl"),
            super::col_sums::variant(jobs),
        )?;
    }
    // The cooperative matmul: every operand load with the default tile, and every
    // candidate tile with the common loads, with and without bounds checks.
    let loads: Vec<Load> = [false, true]
        .into_iter()
        .flat_map(|col| [8, 4, 1].map(|width| Load { col, width }))
        .collect();
    let coop = include_str!("../../../shaders/matmul_coop.wgsl");
    for tc in floats {
        for &a in &loads {
            for &b in &loads {
                push(
                    &mut out,
                    "matmul_coop",
                    coop,
                    matmul_coop::variant(tc, Activation::Identity, (a, b), TILE_128_K64, false, false)?,
                )?;
            }
        }
        for tile in CANDIDATES {
            for act in [Activation::Identity, Activation::Gelu] {
                let (row, col) = (Load { col: false, width: 8 }, Load { col: true, width: 8 });
                for (a, b) in [(row, row), (col, row), (row, col)] {
                    for whole in [false, true] {
                        for plain in [false, true].into_iter().filter(|&p| !p || act == Activation::Identity) {
                            push(
                                &mut out,
                                "matmul_coop",
                                coop,
                                matmul_coop::variant(tc, act, (a, b), tile, whole, plain)?,
                            )?;
                        }
                    }
                }
            }
        }
    }
    conv_net_variants(&mut out)?;
    for (mode, half) in [(0, false), (1, false), (1, true), (2, false), (2, true)] {
        push(
            &mut out,
            "optim",
            include_str!("../../../shaders/optim.wgsl"),
            super::optim::variant(mode, half),
        )?;
    }
    for (mode, half) in [(0, false), (1, false), (1, true), (2, false), (2, true), (3, false), (4, false)] {
        for slots in [super::optim_multi::MIN_SLOTS, super::optim_multi::MAX_SLOTS] {
            // The wide variants: every mode but the sums of squares.
            for wide in [false, true].into_iter().filter(|&w| !w || mode != 4) {
                push(
                    &mut out,
                    "optim_multi",
                    include_str!("../../../shaders/optim_multi.wgsl"),
                    super::optim_multi::variant(mode, half, slots, wide),
                )?;
            }
        }
    }
    for half in [false, true] {
        push(
            &mut out,
            "optim8",
            include_str!("../../../shaders/optim8.wgsl"),
            super::optim::variant_8bit(half),
        )?;
    }
    Ok(out)
}

/// The convolution gathers, pools and BatchNorm passes, every dtype pairing.
fn conv_net_variants(out: &mut Vec<Variant>) -> Result<(), Error> {
    use super::batchnorm::{Epilogue, Pass};
    let floats = [DType::F32, DType::F16];
    for ts in floats {
        for td in floats {
            for mode in 0..4 {
                push(
                    out,
                    "conv",
                    include_str!("../../../shaders/conv.wgsl"),
                    super::conv::variant(mode, ts, td, 1),
                )?;
            }
            for mode in 0..2 {
                push(
                    out,
                    "conv",
                    include_str!("../../../shaders/conv.wgsl"),
                    super::conv::variant(mode, ts, td, 4),
                )?;
                if mode == 0 {
                    let split = super::conv::variant_split(0, ts, td, 4, true);
                    push(out, "conv", include_str!("../../../shaders/conv.wgsl"), split)?;
                }
            }
            for mode in 0..4 {
                let source = include_str!("../../../shaders/pool.wgsl");
                for vec in [false, mode < 2] {
                    push(out, "pool", source, super::pool::variant(mode, ts, ts, td, vec))?;
                    push(out, "pool", source, super::pool::variant(mode, ts, DType::F32, td, vec))?;
                }
            }
            for pass in Pass::ALL {
                for (relu, residual) in [(false, false), (true, false), (true, true)] {
                    let ep = Epilogue { relu, residual };
                    for w in [1, 4] {
                        push(
                            out,
                            "batchnorm",
                            include_str!("../../../shaders/batchnorm.wgsl"),
                            super::batchnorm::variant(pass, [ts, td, DType::F32, td], ep, w),
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}
