//! `wgtrain bench --tune`: every candidate tile of the cooperative-matrix matmul
//! (`kernels::matmul_coop::CANDIDATES`) at 4096^3 and at each product of GPT-2's four
//! linear layers (forward, dX, dW at the gpt2 workload's shapes), each row checked
//! against the CPU like every benchmark. Its table is what `matmul_coop::pick` is
//! chosen from.
//!
//! May call: `bench::{gpt2, kernels, record}`, `error`, `kernels::matmul_coop`, `runtime`,
//! `tensor`.

use super::gpt2::{GPT2, Linear, PRODUCTS, linear, linear_layers};
use super::record::BenchRecord;
use crate::error::Error;
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
    Ok(out)
}
