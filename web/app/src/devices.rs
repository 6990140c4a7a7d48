//! A multi-device run's memory per device: each device's peak per step as a line, a
//! table of each device's peak, reserved bytes and categories at its peak, and what
//! the host holds (offloaded optimizer state). Shown only when the run's lines carry
//! `mem.devices`; over MPI each row names its rank and machine.
//!
//! May call: `charts`, `state`, `wgtrain_record`, leptos. Called by: the app.

use leptos::prelude::*;
use wgtrain_record::{Category, MemLog, StepLog, format_bytes, short_bytes};

use crate::charts::{H, W, axes, byte_ticks, step_byte_scales};
use crate::state::{Ctx, steps};

/// One colour per device (cycled past eight).
const COLOURS: [&str; 8] = [
    "#2e86de", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d", "#d35400",
];

/// The devices panel (see the module).
#[component]
pub fn DevicesView(ctx: Ctx) -> impl IntoView {
    let data = Memo::new(move |_| steps(&ctx.lines.get()));
    let panel = move || {
        let s: Vec<StepLog> = data.get();
        let per_step: Vec<(u64, Vec<MemLog>)> = s
            .iter()
            .filter_map(|l| {
                l.mem
                    .as_ref()
                    .filter(|m| !m.devices.is_empty())
                    .map(|m| (l.step, m.devices.clone()))
            })
            .collect();
        let devices = per_step.last().map_or(0, |(_, d)| d.len());
        let what = if per_step.last().is_some_and(|(_, d)| d.iter().any(|m| m.rank.is_some())) {
            "MPI ranks"
        } else {
            "devices"
        };
        if devices == 0 {
            return None;
        }
        let n = per_step.len();
        let top = per_step
            .iter()
            .flat_map(|(_, d)| d.iter().map(|m| m.peak as f64))
            .fold(0.0, f64::max);
        let ticks = byte_ticks(top * 1.08);
        let ymax = (top * 1.08).max(*ticks.last().unwrap_or(&1.0));
        let (first, last) = (per_step[0].0 as f64, per_step[n - 1].0 as f64);
        let (x, y) = step_byte_scales(first, last, ymax);
        let lines: Vec<_> = (0..devices)
            .map(|d| {
                let path: String = per_step
                    .iter()
                    .enumerate()
                    .filter_map(|(i, (step, m))| {
                        let v = m.get(d)?.peak as f64;
                        Some(format!(
                            "{}{:.1},{:.1} ",
                            if i == 0 { "M" } else { "L" },
                            x.at(*step as f64),
                            y.at(v)
                        ))
                    })
                    .collect();
                view! { <path d=path fill="none" stroke=COLOURS[d % 8] stroke-width="2" data-device=d.to_string() /> }
            })
            .collect();
        // Each device's largest peak over the run, and its categories then.
        let rows: Vec<_> = (0..devices)
            .map(|d| {
                let best = per_step
                    .iter()
                    .filter_map(|(step, m)| m.get(d).map(|m| (*step, m.clone())))
                    .max_by_key(|(_, m)| m.peak)
                    .unwrap_or_default();
                let (step, m) = best;
                // Over MPI each device is a rank's, on a named machine.
                let label = match (m.rank, &m.node) {
                    (Some(r), Some(node)) => format!(" rank {r} on {node}"),
                    (Some(r), None) => format!(" rank {r}"),
                    _ => format!(" device {d}"),
                };
                let cats: String = Category::ALL
                    .iter()
                    .filter_map(|c| {
                        m.at_peak
                            .get(c.name())
                            .filter(|&&b| b > 0)
                            .map(|b| format!("{c} {}", format_bytes(*b)))
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                view! {
                    <tr class="device-row" data-device=d.to_string() data-peak-bytes=m.peak.to_string()>
                        <td class="device-name"><span class="swatch" style=format!("background:{}", COLOURS[d % 8])></span>{label}</td>
                        <td>{format_bytes(m.peak)}</td>
                        <td>{step.to_string()}</td>
                        <td>{format_bytes(m.peak_reserved)}</td>
                        <td>{cats}</td>
                    </tr>
                }
            })
            .collect();
        let host = per_step
            .last()
            .and_then(|_| s.last())
            .and_then(|l| l.mem.as_ref())
            .map(|m| m.host.clone())
            .unwrap_or_default();
        let host_line = (!host.is_empty()).then(|| {
            let text = host
                .iter()
                .map(|(k, v)| format!("{k} {}", format_bytes(*v)))
                .collect::<Vec<_>>()
                .join(", ");
            let total: u64 = host.values().sum();
            view! { <p id="host-memory" data-host-bytes=total.to_string()>"host memory (offloaded): " <b>{text}</b></p> }
        });
        Some(view! {
            <section class="wide" id="devices">
                <h2>{format!("Memory per device ({devices} {what}: each one's peak per step)")}</h2>
                <svg id="devices-chart" class="chart" viewBox=format!("0 0 {W} {H}") data-devices=devices.to_string()>
                    {axes(x, y, short_bytes, ticks, "step".into())}
                    {lines}
                </svg>
                <table id="devices-table">
                    <thead><tr><th>{if what == "devices" { "device" } else { "rank" }}</th><th>"peak"</th><th>"at step"</th><th>"reserved"</th><th>"at its peak"</th></tr></thead>
                    <tbody>{rows}</tbody>
                </table>
                {host_line}
            </section>
        })
    };
    view! { {panel} }
}
