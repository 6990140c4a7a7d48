//! Readable names of kernel variants for the profiler's table and trace: the family
//! with the choices its key encodes (element types, tile, epilogue, vec4 loads, op),
//! e.g. `matmul f16,f16->f32 tm8 gelu a:row4 b:col4` or `map add f32 vec4`.
//!
//! May call: `kernels::{map, matmul_params, reduce, softmax}`, `runtime`, `tensor`.

use super::map::MapOp;
use super::matmul_params::Activation;
use super::reduce::ReduceOp;
use super::softmax::SoftmaxMode;
use crate::runtime::KernelKey;
use crate::tensor::DType;

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::I32, DType::U32];

fn dtype(n: u32) -> &'static str {
    DTYPES.get(n as usize).map_or("?", |d| d.wgsl())
}

fn activation(n: u32) -> &'static str {
    match n {
        x if x == Activation::Relu as u32 => " relu",
        x if x == Activation::Gelu as u32 => " gelu",
        _ => "",
    }
}

/// What the attention kernels' names share: the kernel of the family, qkv's type, dy's
/// (backward) and the head size, from keys that start [mode, tq, td, d / 4].
fn attention(v: &[u32; 8]) -> String {
    let mode = ["forward", "row dot", "backward dK dV", "backward dQ", "row dot + dy f16"]
        .get(v[0] as usize)
        .unwrap_or(&"?");
    let dy = if v[0] == 0 { String::new() } else { format!(",dy {}", dtype(v[2])) };
    format!("flash_attention {mode} {}{dy} d{}", dtype(v[1]), 4 * v[3])
}

/// The readable name of a launch's variant.
pub fn describe(key: &KernelKey) -> String {
    let v = key.variant;
    // Operand loads (`matmul_params::Load::code`): rows or columns, and the width.
    let load = |code: u32| format!("{}{}", if code & 1 == 1 { "col" } else { "row" }, code >> 1);
    let loads = |a: u32, b: u32| format!(" a:{} b:{}", load(a), load(b));
    // A cooperative tile (`CoopTile::packed`): rows x columns of C, K step, buffers.
    let tile = |t: u32| {
        let f = |shift: u32| (t >> shift) & 0xf;
        let (bm, bn) = (f(0) * f(8) * 16, f(4) * f(12) * 16);
        // K step, buffers, two K tiles in flight (a2), threads.
        let ahead = if f(28) == 2 { " a2" } else { "" };
        format!(" {bm}x{bn} k{} x{}{ahead} {}t", (t >> 16) & 0xff, f(24), f(0) * f(4) * 32)
    };
    match key.family {
        "map" => {
            let op = MapOp::ALL
                .get(v[0] as usize)
                .map_or_else(|| "?".to_string(), |o| format!("{o:?}").to_lowercase());
            format!("map {op} {}{}", dtype(v[3]), if v[4] == 4 { " vec4" } else { "" })
        }
        "matmul" => format!(
            "matmul {},{}->{} tm{}{}{}",
            dtype(v[0]),
            dtype(v[1]),
            dtype(v[2]),
            v[3],
            activation(v[4]),
            loads(v[5], v[6])
        ),
        "matmul_coop" => format!(
            "matmul_coop f16,f16->{}{}{}{}",
            dtype(v[0]),
            activation(v[1]),
            loads(v[2], v[3]),
            tile(v[4])
        ),
        "sum_rows" => format!(
            "sum_rows {} {}",
            ["partials", "sums"].get(v[0] as usize).unwrap_or(&"?"),
            dtype(v[1])
        ),
        "matmul_splitk" => format!("matmul split-K sum ->{}{}", dtype(v[0]), activation(v[1])),
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
        "flash_attention" => format!(
            "{} tile{} {}{}",
            attention(&v),
            v[5],
            if v[7] & 1 == 1 { "subgroup" } else { "plain" },
            if v[7] & 2 == 2 { " unrolled" } else { "" }
        ),
        "flash_attention_coop" => format!("{} tile{}x{} coop", attention(&v), v[4], v[5]),
        "flash_attention_tiled" => format!(
            "{} tile{}x{} tm{}{}{} tiled",
            attention(&v),
            v[4],
            v[5],
            v[6],
            match v[7] & 0xff {
                0 => String::new(),
                c => format!(" loop{c}"),
            },
            if v[7] >> 8 & 1 == 1 { " prefetch" } else { "" }
        ),
        family => format!("{family}{v:?}"),
    }
}
