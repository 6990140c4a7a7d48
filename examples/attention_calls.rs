//! Host and GPU time of single flash attention calls (forward + backward at GPT-2's
//! [8, 12, 1024, 64]), one call at a time as `wgtrain bench` makes them: for each call,
//! the wall time from the call to its results (host work, submission and the GPU) and
//! the GPU's own time (timestamps). Shows whether a slow bench row is the kernel or the
//! host around it. Prints JSON per dtype: the medians and the first calls.
//!   cargo run --release --example attention_calls -- [ADAPTER] [CALLS]
use std::sync::Arc;
use std::time::Instant;

use wgtrain_engine::kernels::flash_attention;
use wgtrain_engine::memory::{AllocatorOptions, Category};
use wgtrain_engine::{DType, Gpu, Runtime, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let adapter = args.next();
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let gpu = Arc::new(Gpu::open(adapter.as_deref())?);
    let rt = Runtime::new(gpu, AllocatorOptions::default())?;
    let (b, t, nh, d) = (8, 1024, 12, 64);
    let c = nh * d;
    let data: Vec<f32> = (0..b * t * 3 * c).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
    let dy_data: Vec<f32> = (0..b * t * c).map(|i| ((i * 104_729) % 2001) as f32 / 1000.0 - 1.0).collect();
    let dy = Tensor::from_f32(&rt, &dy_data, &[b, t, c], Category::Activation, "dy")?;
    for dtype in [DType::F32, DType::F16] {
        let qkv = match dtype {
            DType::F16 => Tensor::from_f32_as_f16(&rt, &data, &[b, t, 3 * c], Category::Activation, "qkv")?,
            _ => Tensor::from_f32(&rt, &data, &[b, t, 3 * c], Category::Activation, "qkv")?,
        };
        let (mut wall, mut gpu) = (Vec::new(), Vec::new());
        for _ in 0..calls {
            let start = Instant::now();
            let g = rt.time(|| {
                let saved = flash_attention::forward(&rt, &qkv, nh, "attn")?;
                flash_attention::backward(&rt, &qkv, nh, &saved, &dy, "dattn")?;
                Ok(())
            })?;
            rt.sync()?;
            wall.push(start.elapsed().as_secs_f64() * 1e3);
            gpu.push(g * 1e3);
        }
        let first: Vec<String> = wall.iter().zip(&gpu).take(5).map(|(w, g)| format!("[{w:.2}, {g:.3}]")).collect();
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{{\"dtype\": \"{dtype:?}\", \"calls\": {calls}, \"median_wall_ms\": {:.3}, \"median_gpu_ms\": {:.3}, \"first_wall_gpu_ms\": [{}]}}",
            median(&mut wall),
            median(&mut gpu),
            first.join(", ")
        );
    }
    Ok(())
}
