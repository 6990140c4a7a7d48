//! Host cost of recording a launch (`launch_overhead_*`): the time the host spends in
//! an op call (variant lookup, parameter write, bind group, dispatch recording) for a
//! kernel so small that the GPU's share does not matter. Launches are recorded in
//! batches smaller than the parameter ring, so no submission falls inside the timed
//! part; the GPU runs them after each timed batch, untimed.
//!
//! May call: `bench::record`, `error`, `kernels`, `memory`, `runtime`, `tensor`.

use std::time::Instant;

use super::record::{BenchRecord, median};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::matmul::{MatmulOptions, matmul_into};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Launches recorded per timed batch (below the ring's 1024 slots).
const LAUNCHES: usize = 512;
/// Timed batches; the median is reported.
const REPEATS: usize = 15;

fn host_us_per_launch(rt: &Runtime, mut launch: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
    for _ in 0..LAUNCHES {
        launch()?; // warm: compile the variant, fill the caches
    }
    rt.sync()?;
    let mut samples = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let start = Instant::now();
        for _ in 0..LAUNCHES {
            launch()?;
        }
        samples.push(start.elapsed().as_secs_f64() * 1e6 / LAUNCHES as f64);
        rt.sync()?;
    }
    Ok(median(&mut samples))
}

fn row(kernel: &str, dtype: DType, shape: &[usize], us: f64) -> BenchRecord {
    BenchRecord {
        kernel: kernel.into(),
        dtype: dtype.wgsl().into(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        median_us: us,
        gflops: None,
        gbps: None,
        max_abs_err: None,
        max_rel_err: None,
        ok: us.is_finite(),
        extra: serde_json::json!({ "launches_per_batch": LAUNCHES, "batches": REPEATS, "what": "host time per recorded launch" }),
        ..Default::default()
    }
}

/// Host microseconds per launch of a 1024-element add and of a 64^3 matmul.
pub fn run_all(rt: &Runtime) -> Result<Vec<BenchRecord>, Error> {
    let n = 1024;
    let a = Tensor::full(rt, &[n], DType::F32, 1.0, Category::Input, "bench.a")?;
    let b = Tensor::full(rt, &[n], DType::F32, 2.0, Category::Input, "bench.b")?;
    let c = Tensor::empty(rt, &[n], DType::F32, Category::Temporary, "bench.c")?;
    let map_us = host_us_per_launch(rt, || map_into(rt, MapOp::Add, Some(&a), Some(&b), &c, 1.0, 1.0))?;
    let m = 64;
    let x = Tensor::full(rt, &[m, m], DType::F32, 1.0, Category::Input, "bench.x")?;
    let w = Tensor::full(rt, &[m, m], DType::F32, 1.0, Category::Input, "bench.w")?;
    let y = Tensor::empty(rt, &[m, m], DType::F32, Category::Temporary, "bench.y")?;
    let mm_us = host_us_per_launch(rt, || matmul_into(rt, &x, &w, &y, &MatmulOptions::default()))?;
    Ok(vec![
        row("launch_overhead_map", DType::F32, &[n], map_us),
        row("launch_overhead_matmul", DType::F32, &[m, m, m], mm_us),
    ])
}
