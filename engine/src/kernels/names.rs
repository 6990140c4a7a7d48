//! Readable names of kernel variants for the profiler's table and trace, for the
//! families whose kernels are not named by a plan (the matmuls and the attention are:
//! `kernels::{matmul_plan, attention_plan}`): the family with the choices its key
//! encodes, e.g. `map add f32 vec4`.
//!
//! May call: `kernels::{map, reduce, softmax}`, `runtime`, `tensor`.

use super::map::MapOp;
use super::reduce::ReduceOp;
use super::softmax::SoftmaxMode;
use crate::runtime::KernelKey;
use crate::tensor::DType;

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::I32, DType::U32];

fn dtype(n: u32) -> &'static str {
    DTYPES.get(n as usize).map_or("?", |d| d.wgsl())
}

/// The readable name of a launch's variant.
pub fn describe(key: &KernelKey) -> String {
    let v = key.variant;
    match key.family {
        "map" => {
            let op = MapOp::ALL
                .get(v[0] as usize)
                .map_or_else(|| "?".to_string(), |o| format!("{o:?}").to_lowercase());
            format!("map {op} {}{}", dtype(v[3]), if v[4] == 4 { " vec4" } else { "" })
        }
        "softmax" => {
            let mode = [SoftmaxMode::Softmax, SoftmaxMode::LogSoftmax, SoftmaxMode::Backward]
                .into_iter()
                .find(|m| *m as u32 == v[0])
                .map_or("?".to_string(), |m| format!("{m:?}").to_lowercase());
            format!("softmax {mode} {}->{}", dtype(v[1]), dtype(v[3]))
        }
        "layernorm" => format!(
            "layernorm {} {}",
            ["forward", "backward", "dw partials", "dw sums"].get(v[0] as usize).unwrap_or(&"?"),
            dtype(v[1])
        ),
        "reduce" => {
            let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]
                .into_iter()
                .find(|o| *o as u32 == v[0])
                .map_or("?".to_string(), |o| format!("{o:?}").to_lowercase());
            format!("reduce {op} {}", dtype(v[1]))
        }
        "optim" => format!(
            "optim {}",
            ["unscale + non-finite check", "adamw", "sgd"].get(v[0] as usize).unwrap_or(&"?")
        ),
        "embedding" => format!(
            "embedding {} {}",
            match v[0] {
                0 => "gather",
                1 => "scatter-add rank",
                4 => "scatter-add sorted walk",
                _ => "scatter-add chunked",
            },
            dtype(v[1])
        ),
        "cross_entropy" => format!("cross_entropy {}{}", dtype(v[0]), if v[1] == 1 { " +backward" } else { "" }),
        family => format!("{family}{v:?}"),
    }
}
