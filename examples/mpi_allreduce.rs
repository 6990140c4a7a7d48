//! The all-reduce the MPI backend does for data parallel (`MpiComm::all_reduce_sum`),
//! measured per rank against the ring bound through host memory: a ring all-reduce
//! moves 2 (N - 1) / N of the buffer in and out of each rank, so with host memory as the
//! link the best a rank can do is that volume at the speed this process copies memory
//! (measured here with the same parallel copy, on a buffer of the same size).
//!
//! For each size (MiB of f32; default 4, 25, 100, 400): 2 warm-up sums, then 7 timed
//! (each started together after a barrier), every result checked against the exact sum
//! of every rank's values. Rank 0 prints one JSON line per size: `ms` (median),
//! `bus_gb_s` (2 (N - 1) / N x bytes / time, NCCL's "bus bandwidth"), `copy_gb_s` (this
//! process copying the buffer once) and `of_ring_bound` (bus_gb_s / copy_gb_s), and
//! whether the sum went through the host's shared window or MPI's messages
//! (`WGTRAIN_MPI_SHARED_MEMORY=0`).
//!
//!   mpirun -n 2 target/release/examples/mpi_allreduce [MIB ...]
use std::time::Instant;

use rayon::prelude::*;
use wgtrain_engine::parallel::Collective;
use wgtrain_engine::parallel::collective::copy_parallel;
use wgtrain_engine::parallel::mpi::MpiWorld;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), String> {
    let world = MpiWorld::init()?;
    let comm = world.comm();
    let sizes: Vec<usize> = match std::env::args().skip(1).map(|a| a.parse::<usize>()).collect::<Result<Vec<_>, _>>() {
        Ok(v) if !v.is_empty() => v,
        Ok(_) => vec![4, 25, 100, 400],
        Err(e) => return Err(format!("sizes are whole MiB: {e}")),
    };
    let (n, rank) = (world.size, world.rank);
    for mib in sizes {
        let len = (mib << 20) / 4;
        // Values whose sums are exact in f32: rank r adds r + k % 7.
        let mine = |k: usize| (rank + k % 7) as f32;
        let want = |k: usize| (0..n).map(|r| (r + k % 7) as f32).sum::<f32>();
        let mut buf = vec![0f32; len];
        let mut times = Vec::new();
        for round in 0..9 {
            buf.par_iter_mut().enumerate().for_each(|(k, v)| *v = mine(k));
            comm.sum_f64(0.0).map_err(|e| e.to_string())?;
            let t = Instant::now();
            comm.all_reduce_sum(&mut buf).map_err(|e| e.to_string())?;
            if round >= 2 {
                times.push(t.elapsed().as_secs_f64());
            }
            if let Some(k) = (0..len).step_by(4099).find(|&k| buf[k] != want(k)) {
                return Err(format!("rank {rank}: element {k} summed to {} where {} was due", buf[k], want(k)));
            }
        }
        let copy = {
            let src = vec![1f32; len];
            let mut dst = vec![0f32; len];
            let mut t = Vec::new();
            for _ in 0..5 {
                let s = Instant::now();
                copy_parallel(&src, &mut dst);
                t.push(s.elapsed().as_secs_f64());
            }
            median(t)
        };
        let (t, bytes) = (median(times), (len * 4) as f64);
        let bus = 2.0 * (n - 1) as f64 / n as f64 * bytes / t / 1e9;
        let copy_gb_s = bytes / copy / 1e9;
        if rank == 0 {
            println!(
                "{{\"ranks\": {n}, \"hosts\": {}, \"path\": \"{}\", \"mib\": {mib}, \"ms\": {:.2}, \"bus_gb_s\": {bus:.2}, \"copy_gb_s\": {copy_gb_s:.2}, \"of_ring_bound\": {:.2}}}",
                world.hosts,
                if world.shared_memory { "shared memory" } else { "messages" },
                t * 1e3,
                bus / copy_gb_s
            );
        }
    }
    Ok(())
}
