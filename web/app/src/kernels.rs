//! Where a step's time goes: the kernel table of a profiled step (`wgtrain train
//! --profile-every N`), shown under the same step's memory timeline, and the kernel
//! timings of a `wgtrain bench` file.
//!
//! May call: `wgtrain_record`, leptos. Called by: the app's views.

use leptos::prelude::*;
use wgtrain_record::{BenchRecord, KernelRow, StepLog};

/// The profiled step shown for `chosen`: the last profiled one at or before it, else
/// the last profiled one.
fn profiled_step(lines: &[StepLog], chosen: Option<u64>) -> Option<&StepLog> {
    let profiled = || lines.iter().filter(|l| l.kernels.as_ref().is_some_and(|k| !k.is_empty()));
    chosen
        .and_then(|c| profiled().filter(|l| l.step <= c).max_by_key(|l| l.step))
        .or_else(|| profiled().max_by_key(|l| l.step))
}

/// A rate with the digits it needs.
fn rate(v: Option<f64>) -> String {
    match v {
        Some(v) if v < 10.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.0}"),
        None => String::new(),
    }
}

fn phases(k: &KernelRow) -> String {
    let mut parts: Vec<(&String, &f64)> = k.by_phase.iter().collect();
    parts.sort_by(|a, b| b.1.total_cmp(a.1));
    parts
        .iter()
        .map(|(p, us)| format!("{p} {:.0}%", 100.0 * **us / k.total_us.max(1e-9)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kernel table of the profiled step nearest `chosen`, sorted by time.
#[component]
pub fn StepKernels(lines: RwSignal<Vec<StepLog>>, chosen: Memo<Option<u64>>) -> impl IntoView {
    move || {
        let all = lines.get();
        let Some(line) = profiled_step(&all, chosen.get()) else {
            return view! {
                <p id="step-kernels-none">"no profiled step: train with `--profile-every N` to see each kernel's share of a step here"</p>
            }
            .into_any();
        };
        let kernels = line.kernels.clone().unwrap_or_default();
        let gpu = line.gpu_ms.unwrap_or(0.0);
        let wall = line.step_ms.unwrap_or(0.0);
        let note = if chosen.get() == Some(line.step) {
            String::new()
        } else {
            " (the profiled step nearest the one chosen)".into()
        };
        let shown = kernels.len().min(25);
        view! {
            <h3 id="step-kernels-title" data-step=line.step.to_string()>
                {format!("Where step {}'s time went: GPU busy {gpu:.2} ms of {wall:.2} ms wall, {} launches{note}",
                    line.step, kernels.iter().map(|k| k.calls).sum::<usize>())}
            </h3>
            <table id="step-kernels">
                <tr><th>"kernel"</th><th class="num">"calls"</th><th class="num">"total"</th><th class="num">"mean"</th>
                    <th class="num">"% GPU"</th><th class="num">"GFLOP/s"</th><th class="num">"GB/s"</th><th>"phases"</th></tr>
                {kernels.into_iter().take(shown).map(|k| view! {
                    <tr>
                        <td>{k.name.clone()}</td>
                        <td class="num">{k.calls}</td>
                        <td class="num">{format!("{:.3} ms", k.total_us / 1e3)}</td>
                        <td class="num">{format!("{:.1} us", k.mean_us)}</td>
                        <td class="num">{format!("{:.1}", k.pct)}</td>
                        <td class="num">{rate(k.gflops)}</td>
                        <td class="num">{rate(k.gbps)}</td>
                        <td>{phases(&k)}</td>
                    </tr>
                }).collect_view()}
            </table>
        }
        .into_any()
    }
}

/// The rows of a `wgtrain bench --json` file given to the dashboard.
pub fn bench_table(bench: Vec<BenchRecord>) -> AnyView {
    if bench.is_empty() {
        return view! { <p>"none loaded: run `wgtrain bench --json FILE` and start the dashboard with --bench FILE"</p> }.into_any();
    }
    view! {
        <table id="kernel-table">
            <tr><th>"kernel"</th><th>"dtype"</th><th>"shape"</th><th class="num">"median"</th><th class="num">"GFLOP/s"</th><th class="num">"GB/s"</th></tr>
            {bench.into_iter().map(|b| view! {
                <tr>
                    <td>{b.kernel.clone()}</td>
                    <td>{b.dtype.clone()}</td>
                    <td>{format!("{:?}", b.shape)}</td>
                    <td class="num">{format!("{:.1} us", b.median_us)}</td>
                    <td class="num">{b.gflops.map(|v| format!("{v:.0}")).unwrap_or_default()}</td>
                    <td class="num">{b.gbps.map(|v| format!("{v:.0}")).unwrap_or_default()}</td>
                </tr>
            }).collect_view()}
        </table>
    }
    .into_any()
}
