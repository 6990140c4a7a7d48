//! Allocator microbenchmarks: alloc/free throughput with a warm cache, and reserved
//! versus allocated bytes after the allocation pattern of GPT training steps (llm.c's
//! tensor list: parameters, AdamW state, saved activations, backward temporaries,
//! gradients freed by zero_grad).
//!
//! May call: `bench::{measure, record}`, `memory`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::measure::Rng;
use super::record::{BenchRecord, median};
use crate::Gpu;
use crate::memory::{AllocError, Allocator, AllocatorOptions, Block, Category};

/// Alloc/free pairs of random sizes in `[lo, hi)` with up to `live` blocks held, after a
/// warm-up that fills the cache. Returns the median time per alloc+free pair.
fn churn(alloc: &Allocator, name: &str, lo: u64, hi: u64, live: usize, ops: usize) -> BenchRecord {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut held: Vec<Block> = Vec::with_capacity(live);
    let step = |rng: &mut Rng, held: &mut Vec<Block>| -> bool {
        if held.len() == live {
            let victim = (rng.next_u64() % live as u64) as usize;
            held.swap_remove(victim);
        }
        match alloc.alloc(rng.range(lo, hi), Category::Temporary, name) {
            Ok(b) => {
                held.push(b);
                true
            }
            Err(_) => false,
        }
    };
    let mut ok = true;
    for _ in 0..ops {
        ok &= step(&mut rng, &mut held);
    }
    let before = alloc.stats();
    let rounds = 5;
    let mut per_pair_us = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..ops {
            ok &= step(&mut rng, &mut held);
        }
        per_pair_us.push(start.elapsed().as_secs_f64() * 1e6 / ops as f64);
    }
    let after = alloc.stats();
    let median_us = median(&mut per_pair_us);
    drop(held);
    BenchRecord {
        kernel: name.into(),
        dtype: "bytes".into(),
        shape: vec![lo, hi, live as u64],
        median_us,
        gflops: None,
        gbps: None,
        max_abs_err: None,
        max_rel_err: None,
        ok,
        extra: json!({
            "pairs_per_s": 1e6 / median_us,
            "pages_created_while_timed": after.num_device_alloc - before.num_device_alloc,
            "reserved_bytes": after.reserved.current,
        }),
        ..Default::default()
    }
}

/// GPT sizes for the allocation pattern.
#[derive(Clone, Copy, Debug)]
pub struct GptShape {
    /// Layers.
    pub l: u64,
    /// Heads.
    pub nh: u64,
    /// Width.
    pub c: u64,
    /// Sequence length.
    pub t: u64,
    /// Batch.
    pub b: u64,
    /// Vocabulary.
    pub v: u64,
}

impl GptShape {
    /// nanoGPT's shakespeare-char model (shared/ANCHORS.md's "char" workload).
    pub const CHAR: GptShape = GptShape {
        l: 6,
        nh: 6,
        c: 384,
        t: 256,
        b: 64,
        v: 65,
    };
    /// A small one for quick runs.
    pub const TINY: GptShape = GptShape {
        l: 2,
        nh: 4,
        c: 128,
        t: 64,
        b: 8,
        v: 65,
    };
}

/// Runs `steps` training steps' worth of allocations in f32 and reports the peaks.
pub fn gpt_pattern(alloc: &Allocator, shape: GptShape, steps: usize) -> BenchRecord {
    let GptShape { l, nh, c, t, b, v } = shape;
    let f = 4u64; // f32
    let a = |bytes: u64, cat: Category, label: String| alloc.alloc(bytes * f, cat, &label);
    let mut ok = true;
    let mut check = |r: Result<Block, AllocError>| match r {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::error!("{e}");
            ok = false;
            None
        }
    };
    // Parameter shapes in the order of GPT2LMHeadModel's state dict.
    let mut param_shapes: Vec<(String, u64)> = vec![("wte".into(), v * c), ("wpe".into(), t * c)];
    for i in 0..l {
        for (n, numel) in [
            ("ln_1.weight", c),
            ("ln_1.bias", c),
            ("attn.c_attn.weight", c * 3 * c),
            ("attn.c_attn.bias", 3 * c),
            ("attn.c_proj.weight", c * c),
            ("attn.c_proj.bias", c),
            ("ln_2.weight", c),
            ("ln_2.bias", c),
            ("mlp.c_fc.weight", c * 4 * c),
            ("mlp.c_fc.bias", 4 * c),
            ("mlp.c_proj.weight", 4 * c * c),
            ("mlp.c_proj.bias", c),
        ] {
            param_shapes.push((format!("h.{i}.{n}"), numel));
        }
    }
    param_shapes.push(("ln_f.weight".into(), c));
    param_shapes.push(("ln_f.bias".into(), c));
    let params: Vec<_> = param_shapes
        .iter()
        .filter_map(|(n, s)| check(a(*s, Category::Parameter, n.clone())))
        .collect();
    let mut adam: Vec<Block> = Vec::new();
    let start = Instant::now();
    for _step in 0..steps {
        let input = check(a(b * t, Category::Input, "input_ids".into()));
        let targets = check(a(b * t, Category::Input, "targets".into()));
        // Forward: each layer saves what its backward needs.
        let mut saved: Vec<Vec<Block>> = Vec::new();
        let mut residual = check(a(b * t * c, Category::Activation, "encoded".into()));
        for i in 0..l {
            let mut layer = Vec::new();
            for (n, numel) in [
                ("ln_1", b * t * c),
                ("ln_1.mean", b * t),
                ("ln_1.rstd", b * t),
                ("qkv", b * t * 3 * c),
            ] {
                layer.extend(check(a(numel, Category::Activation, format!("h.{i}.{n}"))));
            }
            let preatt = check(a(b * nh * t * t, Category::Temporary, format!("h.{i}.preatt")));
            layer.extend(check(a(b * nh * t * t, Category::Activation, format!("h.{i}.att"))));
            drop(preatt);
            for (n, numel) in [
                ("atty", b * t * c),
                ("residual2", b * t * c),
                ("ln_2", b * t * c),
                ("ln_2.mean", b * t),
                ("ln_2.rstd", b * t),
                ("fch", b * t * 4 * c),
                ("fch_gelu", b * t * 4 * c),
            ] {
                layer.extend(check(a(numel, Category::Activation, format!("h.{i}.{n}"))));
            }
            layer.extend(residual.take());
            residual = check(a(b * t * c, Category::Activation, format!("h.{i}.residual3")));
            saved.push(layer);
        }
        let lnf = check(a(b * t * c, Category::Activation, "ln_f".into()));
        let logits = check(a(b * t * v, Category::Activation, "logits".into()));
        let losses = check(a(b * t, Category::Activation, "losses".into()));
        // Backward, in reverse; parameter gradients appear as they are reached.
        let mut grads: Vec<Block> = Vec::new();
        let dlogits = check(a(b * t * v, Category::Temporary, "dlogits".into()));
        grads.extend(check(a(v * c, Category::Gradient, "wte.grad".into())));
        drop((logits, losses));
        let mut dresidual = check(a(b * t * c, Category::Temporary, "dresidual".into()));
        drop((dlogits, lnf));
        for i in (0..l).rev() {
            let dfch = check(a(b * t * 4 * c, Category::Temporary, format!("h.{i}.dfch")));
            let dqkv = check(a(b * t * 3 * c, Category::Temporary, format!("h.{i}.dqkv")));
            let datt = check(a(b * nh * t * t, Category::Temporary, format!("h.{i}.datt")));
            for (n, numel) in [
                ("c_fc", c * 4 * c + 4 * c),
                ("c_proj", 4 * c * c + c),
                ("c_attn", c * 3 * c + 3 * c),
            ] {
                grads.extend(check(a(numel, Category::Gradient, format!("h.{i}.{n}.grad"))));
            }
            drop((dfch, dqkv, datt));
            let next = check(a(b * t * c, Category::Temporary, "dresidual".into()));
            dresidual = next;
            saved.pop();
        }
        drop(dresidual);
        drop((input, targets, residual));
        // AdamW: two moments per parameter, made on the first step.
        if adam.is_empty() {
            for (n, s) in &param_shapes {
                adam.extend(check(a(*s, Category::OptimizerState, format!("{n}.exp_avg"))));
                adam.extend(check(a(*s, Category::OptimizerState, format!("{n}.exp_avg_sq"))));
            }
        }
        drop(grads); // zero_grad(set_to_none=True)
        let _ = alloc.end_step();
    }
    let elapsed_us = start.elapsed().as_secs_f64() * 1e6 / steps as f64;
    let stats = alloc.stats();
    drop((params, adam));
    let peak_alloc = stats.allocated.peak.max(1);
    BenchRecord {
        kernel: "alloc_gpt_pattern".into(),
        dtype: "f32".into(),
        shape: vec![l, nh, c, t, b, v],
        median_us: elapsed_us,
        gflops: None,
        gbps: None,
        max_abs_err: None,
        max_rel_err: None,
        ok,
        extra: json!({
            "steps": steps,
            "peak_allocated_bytes": stats.allocated.peak,
            "peak_reserved_bytes": stats.reserved.peak,
            "peak_reserved_over_allocated": stats.reserved.peak as f64 / peak_alloc as f64,
            "end_reserved_bytes": stats.reserved.current,
            "end_inactive_split_bytes": stats.inactive_split_bytes,
            "pages_created": stats.num_device_alloc,
            "num_allocs": stats.num_allocs,
        }),
        ..Default::default()
    }
}

/// Every allocator benchmark, each on a fresh allocator without guard bytes (so the
/// allocator itself is timed, and one benchmark's cache does not pad the next one's
/// reserved bytes); `quick` uses small sizes.
pub fn run_all(gpu: &Arc<Gpu>, quick: bool) -> Result<Vec<BenchRecord>, AllocError> {
    let fresh = || {
        Allocator::new(
            gpu.clone(),
            AllocatorOptions {
                debug: Some(false),
                cap: None,
                ..Default::default()
            },
        )
    };
    let ops = if quick { 2_000 } else { 100_000 };
    Ok(vec![
        churn(&fresh()?, "alloc_free_small", 4, 1 << 20, 256, ops),
        churn(&fresh()?, "alloc_free_large", 1 << 20, 64 << 20, 16, ops / 10),
        gpt_pattern(&fresh()?, if quick { GptShape::TINY } else { GptShape::CHAR }, 3),
    ])
}
