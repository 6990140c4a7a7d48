//! Measures the host transfers a multi-device run makes (device::transfer): for each
//! device named on the command line (adapter selectors; a selector may repeat), a
//! 256 MiB device buffer is copied to the host (download) and back (upload) 5 times,
//! first on each device alone, then on every device at once (one thread each). Prints
//! JSON lines: device, mode, direction, GB/s (median).
//!   cargo run --release --example host_transfer -- 0 1
use std::sync::Arc;
use std::time::Instant;

use wgtrain_engine::device::Gpu;

const BYTES: u64 = 256 << 20;

fn measure(gpu: &Arc<Gpu>, buffer: &wgpu::Buffer) -> (f64, f64, f64) {
    let data = vec![1u8; BYTES as usize];
    let (mut down, mut up, mut read) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..6 {
        let start = Instant::now();
        let d = gpu.download(&[(buffer, 0, BYTES)]).expect("download");
        let started = start.elapsed().as_secs_f64();
        let bytes = d.finish().expect("finish");
        assert_eq!(bytes.len() as u64, BYTES);
        down.push(BYTES as f64 / start.elapsed().as_secs_f64() / 1e9);
        read.push(started);
        let start = Instant::now();
        gpu.upload(&[(buffer, 0, BYTES)], &data).expect("upload");
        gpu.wait().expect("wait");
        up.push(BYTES as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    let median = |mut v: Vec<f64>| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(down), median(up), median(read) * 1e3)
}

fn main() {
    let selectors: Vec<String> = std::env::args().skip(1).collect();
    let selectors = if selectors.is_empty() { vec!["0".to_string()] } else { selectors };
    let gpus: Vec<Arc<Gpu>> = selectors
        .iter()
        .map(|s| Arc::new(Gpu::open(Some(s)).expect("open the adapter")))
        .collect();
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
    let print = |d: usize, mode: &str, (down, up, start_ms): (f64, f64, f64)| {
        println!(
            "{{\"device\": {d}, \"name\": \"{}\", \"mode\": \"{mode}\", \"download_gb_s\": {down:.2}, \"upload_gb_s\": {up:.2}, \"download_start_ms\": {start_ms:.2}}}",
            gpus[d].report.name
        );
    };
    for (d, (g, b)) in gpus.iter().zip(&buffers).enumerate() {
        print(d, "alone", measure(g, b));
    }
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = gpus.iter().zip(&buffers).map(|(g, b)| s.spawn(move || measure(g, b))).collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for (d, r) in results.into_iter().enumerate() {
        print(d, "together", r);
    }
}
