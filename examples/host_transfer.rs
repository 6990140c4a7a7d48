//! Measures the host transfers a multi-device run makes (device::transfer): for each
//! device named on the command line (adapter selectors; a selector may repeat), a
//! 256 MiB device buffer is copied to the host (download) and back (upload) 6 times
//! (the first not counted), first on each device alone, then on every device at once
//! (one thread each, the threads meeting at a barrier before each timed transfer, so
//! that every device makes the same kind of transfer at the same time). Prints the
//! adapters' memory types, then JSON lines: device, mode, whether uploads went through
//! host memory, and GB/s (median) of
//! - `download_gb_s`: a download read into a new vector,
//! - `download_reused_gb_s`: read into a vector the caller keeps (what a step does),
//! - `download_copy_gb_s`: the device's copy alone (waited for before the read), and
//!   `download_read_gb_s`: the read from mapped memory after it,
//! - `upload_gb_s`: an upload until the device has it, and `upload_write_gb_s`: the
//!   call's return (the host's writes), through buffers in host memory where the device
//!   can make them (`pinned`),
//! - `upload_mapped_gb_s`: an upload until the device has it through mapped wgpu
//!   buffers (the way uploads went before; in device memory where the adapter has
//!   resizable BAR),
//! - `download_host_gb_s` and `upload_host_gb_s`: a download into a host vector of the
//!   device's pinned memory until the host can read it, and an upload from one until
//!   the device has it (`device::host_vec`: what the gradient reducer does), and
//!   whether the vectors were pinned (`host_vectors_pinned`).
//!
//!   cargo run --release --example host_transfer -- 0 1
use std::sync::{Arc, Barrier};
use std::time::Instant;

use wgtrain_engine::device::{Gpu, report};

const BYTES: u64 = 256 << 20;
const NAMES: [&str; 9] = [
    "download_gb_s",
    "download_reused_gb_s",
    "download_copy_gb_s",
    "download_read_gb_s",
    "upload_gb_s",
    "upload_write_gb_s",
    "upload_mapped_gb_s",
    "download_host_gb_s",
    "upload_host_gb_s",
];

/// GB/s of each measure, whether uploads went through host memory and whether host
/// vectors were pinned.
type Rates = ([f64; 9], Option<bool>, bool);

fn measure(gpu: &Arc<Gpu>, buffer: &wgpu::Buffer, sync: &Barrier) -> Rates {
    let data = vec![1u8; BYTES as usize];
    let mut kept = vec![0u8; BYTES as usize];
    let mut times: [Vec<f64>; 9] = Default::default();
    let mut pinned_used = None;
    let mut host_pinned = false;
    let range = [(buffer, 0, BYTES)];
    for _ in 0..6 {
        sync.wait();
        let start = Instant::now();
        let bytes = gpu.download(&range).expect("download").finish().expect("finish");
        assert_eq!(bytes.len() as u64, BYTES);
        times[0].push(start.elapsed().as_secs_f64());
        drop(bytes);

        sync.wait();
        let start = Instant::now();
        let d = gpu.download(&range).expect("download");
        d.finish_into(&mut kept).expect("finish");
        times[1].push(start.elapsed().as_secs_f64());

        sync.wait();
        let start = Instant::now();
        let d = gpu.download(&range).expect("download");
        gpu.wait().expect("wait");
        let copied = Instant::now();
        d.finish_into(&mut kept).expect("finish");
        times[2].push((copied - start).as_secs_f64());
        times[3].push(copied.elapsed().as_secs_f64());

        for (pinned, total, written) in [(true, 4, Some(5)), (false, 6, None)] {
            gpu.set_pinned_uploads(pinned);
            sync.wait();
            let start = Instant::now();
            gpu.upload(&range, &data).expect("upload");
            if let Some(w) = written {
                times[w].push(start.elapsed().as_secs_f64());
                pinned_used = gpu.pinned_uploads();
            }
            gpu.wait().expect("wait");
            times[total].push(start.elapsed().as_secs_f64());
        }
        gpu.set_pinned_uploads(true);

        sync.wait();
        let start = Instant::now();
        let v = gpu.download_host(&range).expect("download").finish().expect("finish");
        times[7].push(start.elapsed().as_secs_f64());
        host_pinned = v.is_pinned_for(gpu);
        assert_eq!(v.len() as u64, BYTES / 4);

        sync.wait();
        let start = Instant::now();
        gpu.upload_host(&range, v).expect("upload");
        gpu.wait().expect("wait");
        times[8].push(start.elapsed().as_secs_f64());
    }
    let rates = times.map(|mut v| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        BYTES as f64 / v[v.len() / 2] / 1e9
    });
    (rates, pinned_used, host_pinned)
}

fn main() {
    let selectors: Vec<String> = std::env::args().skip(1).collect();
    let selectors = if selectors.is_empty() { vec!["0".to_string()] } else { selectors };
    let gpus: Vec<Arc<Gpu>> = selectors
        .iter()
        .map(|s| Arc::new(Gpu::open(Some(s)).expect("open the adapter")))
        .collect();
    for (d, g) in gpus.iter().enumerate() {
        for (i, t) in report::memory_types(&g.adapter).iter().enumerate() {
            println!("# device {d} memory type {i}: {t}");
        }
    }
    let buffers: Vec<wgpu::Buffer> = gpus
        .iter()
        .map(|g| {
            g.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("transfer test"),
                size: BYTES,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
        .collect();
    let print = |d: usize, mode: &str, (rates, pinned, host): Rates| {
        let fields: Vec<String> = NAMES.iter().zip(rates).map(|(n, r)| format!("\"{n}\": {r:.2}")).collect();
        println!(
            "{{\"device\": {d}, \"name\": \"{}\", \"mode\": \"{mode}\", \"uploads_in_host_memory\": {}, \"host_vectors_pinned\": {host}, {}}}",
            gpus[d].report.name,
            pinned.unwrap_or(false),
            fields.join(", ")
        );
    };
    for (d, (g, b)) in gpus.iter().zip(&buffers).enumerate() {
        print(d, "alone", measure(g, b, &Barrier::new(1)));
    }
    let barrier = Barrier::new(gpus.len());
    let results: Vec<_> = std::thread::scope(|s| {
        let sync = &barrier;
        let hs: Vec<_> = gpus
            .iter()
            .zip(&buffers)
            .map(|(g, b)| s.spawn(move || measure(g, b, sync)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for (d, r) in results.into_iter().enumerate() {
        print(d, "together", r);
    }
}
