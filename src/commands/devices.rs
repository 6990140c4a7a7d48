//! `wgtrain devices [--json] [--gl]`: every adapter with the facts kernels choose by
//! (GL's adapters too with --gl, or when no native backend has one).
//!
//! May call: `wgtrain_engine::device`, `commands`.

use clap::Args;

use super::CliResult;
use wgtrain_engine::device::{self, AdapterReport};
use wgtrain_engine::memory::format_bytes;

/// Arguments of `wgtrain devices`.
#[derive(Args)]
pub struct DevicesArgs {
    /// Print JSON (a list, one object per adapter).
    #[arg(long)]
    json: bool,
    /// Also probe the GL backend (`--adapter gl` selects its adapter).
    #[arg(long)]
    gl: bool,
}

/// Lists adapters.
pub fn run(args: DevicesArgs) -> CliResult {
    let adapters = device::list_adapters_for(args.gl.then_some("gl"));
    if args.json {
        say!("{}", serde_json::to_string_pretty(&adapters)?);
        return Ok(());
    }
    if adapters.is_empty() {
        return Err(device::DeviceError::NoAdapter.into());
    }
    for a in &adapters {
        print_adapter(a);
    }
    Ok(())
}

fn print_adapter(a: &AdapterReport) {
    say!("[{}] {} ({}, {})", a.index, a.name, a.backend, a.device_type);
    say!("    driver:   {}", a.driver);
    say!(
        "    memory:   {}",
        a.memory_bytes.map_or("not reported by this backend".into(), format_bytes)
    );
    if let (Some(budget), Some(usage)) = (a.memory_budget_bytes, a.memory_usage_bytes) {
        say!(
            "    budget:   {} for this process, {} of it in use (free {})",
            format_bytes(budget),
            format_bytes(usage),
            format_bytes(budget.saturating_sub(usage))
        );
    }
    say!(
        "    features: {}",
        if a.features.is_empty() {
            "none".into()
        } else {
            a.features.join(", ")
        }
    );
    let l = &a.limits;
    say!(
        "    limits:   buffer {}, storage binding {}, offset alignment {}, workgroup memory {}, invocations {}",
        format_bytes(l.max_buffer_size),
        format_bytes(l.max_storage_buffer_binding_size),
        l.min_storage_buffer_offset_alignment,
        format_bytes(l.max_compute_workgroup_storage_size as u64),
        l.max_compute_invocations_per_workgroup
    );
    if !a.cooperative_matrix.is_empty() {
        let configs: Vec<String> = a
            .cooperative_matrix
            .iter()
            .map(|c| format!("{}x{}x{} {}->{}", c.m, c.n, c.k, c.ab, c.cr))
            .collect();
        say!("    cooperative matrix: {}", configs.join(", "));
    }
}
