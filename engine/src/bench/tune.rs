//! `wgtrain bench --tune`: every variant of the f32 tiled matmul
//! (`kernels::matmul_params::SimtTile::candidates`) and every candidate tile of the
//! cooperative-matrix matmul (`kernels::matmul_coop::CANDIDATES`), at 4096^3 and at each
//! product of GPT-2's four linear layers (forward, dX, dW at the gpt2 workload's
//! shapes), and every tile of the tensor-core flash attention
//! (`kernels::flash_attention_coop::candidates`, at GPT-2's shape: forward, forward +
//! backward, and forward + backward with the tile in dQ alone (`.bwd_q`) or dK dV alone
//! (`.bwd_kv`), the other kernels picked), each row checked against the CPU like every
//! benchmark (a loose check for the attention: `tests/flash_attention.rs` is the strict one). Its tables are
//! what `SimtTile::DEFAULT`, `matmul_coop::pick` and `flash_attention_coop::pick` are
//! chosen from. The tensor-core rows need an adapter with 16x16x16 f16 cooperative
//! matrices and subgroups of 32; elsewhere only the f32 rows run.
//!
//! May call: `bench::{gpt2, kernels, record}`, `error`, `kernels::flash_attention`,
//! `kernels::flash_attention_coop`, `kernels::matmul_coop`, `runtime`, `tensor`.

use super::gpt2::{Attention, GPT2, Linear, PRODUCTS, attention_row, linear, linear_layers};
use super::record::BenchRecord;
use crate::error::Error;
use crate::kernels::flash_attention::BackwardTiles;
use crate::kernels::flash_attention_coop::{CoopMode, candidates};
use crate::kernels::matmul_coop::{CANDIDATES, workgroup_bytes};
use crate::kernels::matmul_params::{MatmulVariant, SimtTile};
use crate::runtime::Runtime;
use crate::tensor::DType;

/// The sweep's rows whose name passes `wanted`.
pub fn run_all(rt: &Runtime, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<BenchRecord>, Error> {
    let mut out = Vec::new();
    let limit = u64::from(rt.gpu.caps.limits.max_compute_workgroup_storage_size);
    for tile in SimtTile::candidates().into_iter().filter(|t| t.workgroup_bytes(8) <= limit) {
        matmul_rows(rt, wanted, MatmulVariant::Simt(tile), DType::F32, &mut out)?;
    }
    if !(rt.gpu.caps.coop_f16_16x16x16() && rt.gpu.caps.subgroup_size == (32, 32)) {
        return Ok(out);
    }
    for tile in CANDIDATES.into_iter().filter(|t| workgroup_bytes(*t) <= limit) {
        matmul_rows(rt, wanted, MatmulVariant::Coop(tile), DType::F16, &mut out)?;
    }
    let sync = if rt.gpu.caps.subgroup_barrier {
        vec![true, false]
    } else {
        vec![false]
    };
    for tile in sync.into_iter().flat_map(candidates) {
        let fits = [CoopMode::Forward, CoopMode::KeyValue, CoopMode::Query]
            .iter()
            .all(|&m| tile.workgroup_bytes(m, GPT2.head() as u32) <= limit);
        let name = format!("tune.flash.{}", tile.name());
        // The tile in every kernel; then in one backward kernel, the rest picked (its
        // row against the others' says what the tile does for that kernel alone).
        let only = |query: bool| BackwardTiles {
            query: Some(tile).filter(|_| query),
            key_value: Some(tile).filter(|_| !query),
        };
        for (what, forward, backward) in [
            ("fwd", Some(tile), None),
            ("fwd_bwd", Some(tile), Some(BackwardTiles::both(Some(tile)))),
            ("bwd_q", None, Some(only(true))),
            ("bwd_kv", None, Some(only(false))),
        ] {
            let name = format!("{name}.{what}");
            if fits && wanted(&name) {
                out.push(logged(attention_row(
                    rt,
                    &name,
                    GPT2,
                    DType::F16,
                    Attention::Fused(forward, backward.unwrap_or_default()),
                    backward.is_some(),
                )?));
            }
        }
    }
    Ok(out)
}

/// One matmul variant's rows: 4096^3 and GPT-2's linear products.
fn matmul_rows(
    rt: &Runtime,
    wanted: &dyn Fn(&str) -> bool,
    forced: MatmulVariant,
    dtype: DType,
    out: &mut Vec<BenchRecord>,
) -> Result<(), Error> {
    let prefix = forced.row_prefix();
    let name = format!("{prefix}matmul_{}", if dtype == DType::F32 { "f32" } else { "coop_f16" });
    if wanted(&name) {
        out.push(logged(super::kernels::matmul(rt, &name, [4096; 3], dtype, forced)?));
    }
    for (layer, k, n) in linear_layers(GPT2.c) {
        for (what, product) in PRODUCTS {
            if wanted(&format!("{prefix}gpt2.{layer}.{what}")) {
                let l = Linear {
                    model: "gpt2",
                    layer,
                    rows: GPT2.rows(),
                    k,
                    n,
                    product,
                    dtype,
                    forced,
                };
                out.push(logged(linear(rt, l)?));
            }
        }
    }
    Ok(())
}

/// `r`, logged as it is measured (`WGTRAIN_LOG=info`): a sweep takes minutes.
fn logged(r: BenchRecord) -> BenchRecord {
    tracing::info!("{} {:.1} us, {:.0} GFLOP/s", r.kernel, r.median_us, r.gflops.unwrap_or(0.0));
    r
}
