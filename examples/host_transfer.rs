//! Measures the host transfers a multi-device run makes (device::transfer): for each
//! device named on the command line (adapter selectors; a selector may repeat), a
//! 256 MiB device buffer is copied to the host (download) and back (upload) 6 times
//! (the first not counted), first on each device alone, then on every device at once
//! (one thread each). Prints the adapters' memory types, then JSON lines: device,
//! mode, and GB/s (median) of
//! - `download_gb_s`: a download read into a new vector (what the reducer does),
//! - `download_reused_gb_s`: read into a vector the caller keeps,
//! - `download_copy_gb_s`: the device's copy alone (waited for before the read), and
//!   `download_read_gb_s`: the read from mapped memory after it,
//! - `upload_gb_s`: an upload until the device has it, and `upload_write_gb_s`: the
//!   host's writes into mapped memory (the call's return).
//!
//!   cargo run --release --example host_transfer -- 0 1
use std::sync::Arc;
use std::time::Instant;

use wgtrain_engine::device::{Gpu, report};

const BYTES: u64 = 256 << 20;
const NAMES: [&str; 6] = [
    "download_gb_s",
    "download_reused_gb_s",
    "download_copy_gb_s",
    "download_read_gb_s",
    "upload_gb_s",
    "upload_write_gb_s",
];

fn measure(gpu: &Arc<Gpu>, buffer: &wgpu::Buffer) -> [f64; 6] {
    let data = vec![1u8; BYTES as usize];
    let mut kept = vec![0u8; BYTES as usize];
    let mut times: [Vec<f64>; 6] = Default::default();
    let range = [(buffer, 0, BYTES)];
    for _ in 0..6 {
        let start = Instant::now();
        let bytes = gpu.download(&range).expect("download").finish().expect("finish");
        assert_eq!(bytes.len() as u64, BYTES);
        times[0].push(start.elapsed().as_secs_f64());
        drop(bytes);

        let start = Instant::now();
        let d = gpu.download(&range).expect("download");
        d.finish_into(&mut kept).expect("finish");
        times[1].push(start.elapsed().as_secs_f64());

        let start = Instant::now();
        let d = gpu.download(&range).expect("download");
        gpu.wait().expect("wait");
        let copied = Instant::now();
        d.finish_into(&mut kept).expect("finish");
        times[2].push((copied - start).as_secs_f64());
        times[3].push(copied.elapsed().as_secs_f64());

        let start = Instant::now();
        gpu.upload(&range, &data).expect("upload");
        times[5].push(start.elapsed().as_secs_f64());
        gpu.wait().expect("wait");
        times[4].push(start.elapsed().as_secs_f64());
    }
    times.map(|mut v| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        BYTES as f64 / v[v.len() / 2] / 1e9
    })
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
    let print = |d: usize, mode: &str, rates: [f64; 6]| {
        let fields: Vec<String> = NAMES.iter().zip(rates).map(|(n, r)| format!("\"{n}\": {r:.2}")).collect();
        println!(
            "{{\"device\": {d}, \"name\": \"{}\", \"mode\": \"{mode}\", {}}}",
            gpus[d].report.name,
            fields.join(", ")
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
