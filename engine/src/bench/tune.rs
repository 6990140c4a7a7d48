//! `wgtrain bench --tune`: every candidate tile of the cooperative-matrix matmul
//! (`kernels::matmul_coop::CANDIDATES`) at 4096^3 and at each product of GPT-2's four
//! linear layers (forward, dX, dW at the gpt2 workload's shapes), and every tile of the
//! tensor-core flash attention (`kernels::flash_attention_coop::candidates`, forward and
//! forward + backward at GPT-2's shape), each row checked against the CPU like every
//! benchmark. Its tables are what `matmul_coop::pick` and `flash_attention_coop::pick`
//! are chosen from.
//!
//! May call: `bench::{gpt2, kernels, record}`, `error`, `kernels::flash_attention_coop`,
//! `kernels::matmul_coop`, `runtime`, `tensor`.

use super::gpt2::{Attention, GPT2, Linear, PRODUCTS, attention_row, linear, linear_layers};
use super::record::BenchRecord;
use crate::error::Error;
use crate::kernels::flash_attention_coop::{CoopMode, candidates};
use crate::kernels::matmul_coop::{CANDIDATES, workgroup_bytes};
use crate::runtime::Runtime;
use crate::tensor::DType;

/// The sweep's rows whose name passes `wanted`; an adapter without 16x16x16 f16
/// cooperative matrices and subgroups of 32 is an error.
pub fn run_all(rt: &Runtime, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<BenchRecord>, Error> {
    if !(rt.gpu.caps.coop_f16_16x16x16() && rt.gpu.caps.subgroup_size == (32, 32)) {
        return Err(Error::invalid(
            "bench --tune",
            "an adapter with 16x16x16 f16 cooperative matrices and subgroups of 32 (see `wgtrain devices`)",
        ));
    }
    let limit = u64::from(rt.gpu.device.limits().max_compute_workgroup_storage_size);
    let mut out = Vec::new();
    for tile in CANDIDATES.into_iter().filter(|t| workgroup_bytes(*t) <= limit) {
        let name = format!("tune.{}.matmul_coop_f16", tile.name());
        if wanted(&name) {
            out.push(super::kernels::matmul(rt, &name, [4096; 3], DType::F16, false, Some(tile))?);
        }
        for (layer, k, n) in linear_layers(GPT2.c) {
            for (what, product) in PRODUCTS {
                if wanted(&format!("tune.{}.gpt2.{layer}.{what}", tile.name())) {
                    let l = Linear {
                        layer,
                        rows: GPT2.rows(),
                        k,
                        n,
                        product,
                        dtype: DType::F16,
                        tile: Some(tile),
                    };
                    out.push(linear(rt, l)?);
                }
            }
        }
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
        for (what, backward) in [("fwd", false), ("fwd_bwd", true)] {
            let name = format!("{name}.{what}");
            if fits && wanted(&name) {
                out.push(attention_row(rt, &name, GPT2, DType::F16, Attention::Fused(Some(tile)), backward)?);
            }
        }
    }
    Ok(out)
}
