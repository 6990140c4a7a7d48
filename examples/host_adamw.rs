//! Times the host AdamW of `parallel.offload = "optimizer"` (optim::HostOptimizer) on
//! PARAMS parameters (default GPT-2 small's 124,439,808), split into SHARDS equal
//! parameters, after one warm-up step; prints JSON: the median of 5 steps, in ms, and
//! the bytes moved per second (weights, gradient and two moments read, three written).
//!   cargo run --release --example host_adamw -- [PARAMS] [SHARDS]
use std::time::Instant;

use wgtrain_engine::kernels::optim::AdamW;
use wgtrain_engine::optim::{HostOptimizer, Rule};

fn main() {
    let mut args = std::env::args().skip(1);
    let params: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(124_439_808);
    let shards: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let per = params.div_ceil(shards);
    let rule = Rule::AdamW(AdamW::default());
    let mut opt = HostOptimizer::default();
    let mut weights: Vec<Vec<f32>> = (0..shards).map(|s| vec![0.01 * s as f32; per]).collect();
    let grads: Vec<Vec<f32>> = (0..shards).map(|s| vec![1e-3 * (s + 1) as f32; per]).collect();
    let mut times = Vec::new();
    for step in 1..=6u32 {
        let start = Instant::now();
        for (i, (w, g)) in weights.iter_mut().zip(&grads).enumerate() {
            opt.update(&rule, i, w.len(), w, g, 1e-3, step);
        }
        if step > 1 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    let ms = times[times.len() / 2];
    let bytes = (per * shards * 4 * 7) as f64;
    println!(
        "{{\"params\": {}, \"threads\": {}, \"median_ms\": {ms:.2}, \"gb_per_s\": {:.1}}}",
        per * shards,
        rayon::current_num_threads(),
        bytes / ms / 1e6
    );
}
