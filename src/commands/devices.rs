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
    let adapters = device::list_adapters_with_budget(args.gl.then_some("gl"));
    if args.json {
        // Each report, with the budget and usage of the moment where told (a report
        // saved for `estimate --described` reads back without them).
        let mut list = Vec::new();
        for (report, budget) in &adapters {
            let mut v = serde_json::to_value(report)?;
            if let Some(b) = budget {
                v["memory_budget_bytes"] = b.budget.into();
                v["memory_usage_bytes"] = b.usage.into();
            }
            list.push(v);
        }
        say!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    if adapters.is_empty() {
        return Err(device::DeviceError::NoAdapter.into());
    }
    for (a, budget) in &adapters {
        print_adapter(a, *budget);
    }
    Ok(())
}

fn print_adapter(a: &AdapterReport, budget: Option<device::budget::MemoryBudget>) {
    say!("[{}] {} ({}, {})", a.index, a.name, a.backend, a.device_type);
    say!("    driver:   {}", a.driver);
    say!(
        "    memory:   {}",
        a.memory_bytes.map_or("not reported by this backend".into(), format_bytes)
    );
    if let Some(b) = budget {
        say!(
            "    budget:   {} for this process, {} of it in use (free {})",
            format_bytes(b.budget),
            format_bytes(b.usage),
            format_bytes(b.budget.saturating_sub(b.usage))
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
