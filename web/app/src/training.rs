//! Training curves as a TensorBoard user reads them: loss (smoothed, raw faint, eval,
//! log scale) with other runs overlaid, the learning rate, step time, throughput, the
//! gradient norm (where clipping computes it), GPU busy (profiled steps), the process's
//! host memory and the loss scale, over steps or wall time, zoomed by dragging; the compared runs'
//! config differences; the device, the run's config and kernel timings.
//!
//! May call: `charts`, `kernels`, `state`, `wgtrain_record`, leptos. Called
//! by: the app.

use std::collections::BTreeMap;

use leptos::prelude::*;
use wgtrain_record::{RunView, StepLog, flat_config, format_bytes};

use crate::charts::{ChartOptions, Series, XAxis, line_chart, number, smooth};
use crate::kernels;
use crate::state::{Ctx, api, get_json, steps};

/// Colours of compared runs, in order.
const OTHERS: [&str; 6] = ["#f28e2b", "#76b7b2", "#b07aa1", "#9c755f", "#edc948", "#59a14f"];
/// One colour per layer of the update/weight ratio chart (cycled).
const COLOURS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
];

/// `config` flattened to `section.key` -> value text.
fn config_of(r: &RunView) -> BTreeMap<String, String> {
    r.info.as_ref().map(|i| flat_config(&i.config)).unwrap_or_default()
}

/// The training view (see the module).
#[component]
pub fn TrainingView(ctx: Ctx) -> impl IntoView {
    let axis = RwSignal::new(XAxis::Step);
    let smoothing = RwSignal::new(0.6f64);
    let log_y = RwSignal::new(false);
    let zoom = RwSignal::new(None::<(f64, f64)>);
    let others = RwSignal::new(Vec::<RunView>::new());
    // The compared runs' lines and configs.
    Effect::new(move |_| {
        let names = ctx.compare.get();
        let current = ctx.run_name.get();
        others.set(Vec::new());
        for name in names.into_iter().filter(|n| Some(n) != current.as_ref()) {
            leptos::task::spawn_local(async move {
                if let Ok(v) = get_json::<RunView>(&api(&name, "")).await
                    && ctx.compare.get_untracked().contains(&name)
                {
                    others.update(|o| {
                        o.retain(|r| r.name != v.name);
                        o.push(v)
                    });
                }
            });
        }
    });
    let charts = move || {
        let l = ctx.lines.get();
        let s = steps(&l);
        let ax = axis.get();
        let t0 = l.iter().find_map(|x| x.time);
        let pt = |lines: &[StepLog], value: fn(&StepLog) -> Option<f64>| -> Vec<(f64, f64)> {
            let t0 = lines.iter().find_map(|x| x.time);
            lines
                .iter()
                .filter(|x| x.is_step())
                .filter_map(|x| Some((ax.of(x, t0)?, value(x)?)))
                .collect()
        };
        let w = smoothing.get();
        let loss = pt(&l, |x| x.loss);
        let evals: Vec<(f64, f64)> = l.iter().filter_map(|x| Some((ax.of(x, t0)?, x.eval.as_ref()?.loss))).collect();
        let skipped: Vec<f64> = s.iter().filter(|x| x.skipped == Some(true)).filter_map(|x| ax.of(x, t0)).collect();
        let mut loss_series = vec![
            Series {
                name: "train loss (raw)".into(),
                colour: "#4e79a7".into(),
                points: loss.clone(),
                faint: true,
            },
            Series {
                name: format!("{} train loss", ctx.run_name.get().unwrap_or_default()),
                colour: "#4e79a7".into(),
                points: smooth(&loss, w),
                faint: false,
            },
            Series {
                name: "eval loss".into(),
                colour: "#e15759".into(),
                points: evals,
                faint: false,
            },
        ];
        for (i, o) in others.get().iter().enumerate() {
            loss_series.push(Series {
                name: format!("{} train loss", o.name),
                colour: OTHERS[i % OTHERS.len()].into(),
                points: smooth(&pt(&o.lines, |x| x.loss), w),
                faint: false,
            });
        }
        let opts = |y_fmt: fn(f64) -> String, log: bool, marks: Vec<f64>| ChartOptions {
            y_fmt,
            log_y: log,
            zoom: zoom.get(),
            x_name: ax.name(),
            marks,
        };
        let last = s.last().cloned().unwrap_or_default();
        let last_eval = l.iter().rev().find_map(|x| x.eval.clone());
        let tokens = s.iter().any(|x| x.tokens_per_s.is_some());
        let scale = pt(&l, |x| x.scale);
        let lr = pt(&l, |x| x.lr);
        let grad_norm = pt(&l, |x| x.grad_norm);
        let host = pt(&l, |x| x.host_rss.map(|b| b as f64 / 1048576.0));
        // Each layer's update/weight ratio, log10 (train.log_update_ratio): one line a
        // layer, the common ~-3 of a healthy run readable at a glance.
        let layers: std::collections::BTreeSet<String> =
            l.iter().flat_map(|x| x.update_ratio.iter().flat_map(|m| m.keys().cloned())).collect();
        let ratio_series: Vec<Series> = layers
            .iter()
            .enumerate()
            .map(|(i, layer)| Series {
                name: layer.clone(),
                colour: COLOURS[i % COLOURS.len()].into(),
                points: l
                    .iter()
                    .filter_map(|x| {
                        let r = *x.update_ratio.as_ref()?.get(layer)?;
                        (r > 0.0).then(|| Some((ax.of(x, t0)?, r.log10())))?
                    })
                    .collect(),
                faint: false,
            })
            .collect();
        // GPU busy over the step's wall time, on the profiled steps (--profile-every).
        let busy = pt(&l, |x| Some(100.0 * x.gpu_ms? / x.step_ms?));
        // A curve of this run, and the same curve of every compared run beside it.
        let compared = others.get();
        let one = |name: &str, colour: &str, points: Vec<(f64, f64)>, value: fn(&StepLog) -> Option<f64>| {
            let mut all = vec![Series {
                name: name.into(),
                colour: colour.into(),
                points,
                faint: false,
            }];
            for (i, o) in compared.iter().enumerate() {
                let points = pt(&o.lines, value);
                if !points.is_empty() {
                    all.push(Series {
                        name: format!("{}: {name}", o.name),
                        colour: OTHERS[i % OTHERS.len()].into(),
                        points,
                        faint: false,
                    });
                }
            }
            all
        };
        view! {
            <div class="facts">
                <span>"loss " <b id="last-loss" data-loss=last.loss.map(|v| v.to_string()).unwrap_or_default()>{format!("{:.4}", last.loss.unwrap_or(0.0))}</b></span>
                {last_eval.map(|e| view! { <span>"eval loss " <b>{format!("{:.4}", e.loss)}</b>
                    {e.accuracy.map(|a| format!(" · accuracy {:.2}%", 100.0 * a))}</span> })}
                <span>"step " <b>{format!("{:.1} ms", last.step_ms.unwrap_or(0.0))}</b></span>
                {if tokens {
                    format!("{:.0} tokens/s", last.tokens_per_s.unwrap_or(0.0))
                } else {
                    format!("{:.0} samples/s", last.samples_per_s.unwrap_or(0.0))
                }}
                {last.mfu.map(|m| view! { <span>"MFU " <b>{format!("{:.1}%", 100.0 * m)}</b></span> })}
                {last.scale.map(|v| view! { <span>"loss scale " <b>{format!("{v}")}</b>{format!(" · skipped steps {}", skipped.len())}</span> })}
            </div>
            {line_chart("loss-chart", loss_series, opts(number, log_y.get(), skipped.clone()), zoom)}
            {line_chart("lr-chart", one("learning rate", "#9c755f", lr, |x| x.lr), opts(|v| format!("{v:.1e}"), false, Vec::new()), zoom)}
            {line_chart("time-chart", one("step time (ms)", "#59a14f", pt(&l, |x| x.step_ms), |x| x.step_ms), opts(number, false, Vec::new()), zoom)}
            {if tokens {
                line_chart("throughput-chart", one("throughput (tokens/s)", "#f28e2b", pt(&l, |x| x.tokens_per_s), |x| x.tokens_per_s), opts(number, false, Vec::new()), zoom)
            } else {
                line_chart("throughput-chart", one("throughput (samples/s)", "#f28e2b", pt(&l, |x| x.samples_per_s), |x| x.samples_per_s), opts(number, false, Vec::new()), zoom)
            }}
            {(!grad_norm.is_empty()).then(|| line_chart("grad-norm-chart", one("gradient norm before clipping", "#e15759", grad_norm.clone(), |x| x.grad_norm), opts(number, false, Vec::new()), zoom))}
            {(!ratio_series.is_empty()).then(|| line_chart("update-ratio-chart", ratio_series.clone(), opts(number, false, Vec::new()), zoom))}
            {(!busy.is_empty()).then(|| line_chart("gpu-busy-chart", one("GPU busy, % of the step", "#edc948", busy.clone(), |x| Some(100.0 * x.gpu_ms? / x.step_ms?)), opts(number, false, Vec::new()), zoom))}
            {(!host.is_empty()).then(|| line_chart("host-memory-chart", one("host memory of the process (MiB)", "#76b7b2", host.clone(), |x| x.host_rss.map(|b| b as f64 / 1048576.0)), opts(number, false, Vec::new()), zoom))}
            {(!scale.is_empty()).then(|| line_chart("scale-chart", one("loss scale (red: skipped steps)", "#b07aa1", scale.clone(), |x| x.scale), opts(number, true, skipped.clone()), zoom))}
        }
    };
    let compare_list = move || {
        let current = ctx.run_name.get();
        let entries: Vec<String> = ctx
            .runs
            .get()
            .into_iter()
            .map(|r| r.name)
            .filter(|n| Some(n) != current.as_ref())
            .collect();
        if entries.is_empty() {
            return view! { <span class="small">"no other runs to compare (a runs folder with several logs has them)"</span> }.into_any();
        }
        entries
            .into_iter()
            .map(|n| {
                let checked = ctx.compare.get().contains(&n);
                let name = n.clone();
                view! {
                    <label class="compare"><input type="checkbox" data-run=n.clone() checked=checked on:change=move |ev| {
                        let on = event_target_checked(&ev);
                        ctx.compare.update(|c| {
                            c.retain(|x| *x != name);
                            if on {
                                c.push(name.clone())
                            }
                        });
                    } />{n.clone()}</label>
                }
            })
            .collect_view()
            .into_any()
    };
    let diff = move || {
        let o = others.get();
        if o.is_empty() {
            return None;
        }
        let run = ctx.run.get();
        let mine = config_of(&run);
        let theirs: Vec<BTreeMap<String, String>> = o.iter().map(config_of).collect();
        let keys: Vec<String> = mine
            .keys()
            .chain(theirs.iter().flat_map(|t| t.keys()))
            .filter(|k| theirs.iter().any(|t| t.get(*k) != mine.get(*k)))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        Some(view! {
            <h3>"Config differences"</h3>
            <table id="config-diff">
                <tr><th>"key"</th><th>{run.name.clone()}</th>{o.iter().map(|r| view! { <th>{r.name.clone()}</th> }).collect_view()}</tr>
                {keys.into_iter().map(|k| view! {
                    <tr><td>{k.clone()}</td><td>{mine.get(&k).cloned().unwrap_or_default()}</td>
                    {theirs.iter().map(|t| view! { <td>{t.get(&k).cloned().unwrap_or_default()}</td> }).collect_view()}</tr>
                }).collect_view()}
            </table>
        })
    };
    let device = move || {
        let r = ctx.run.get();
        let rows: Vec<(String, String)> = match &r.info {
            Some(info) => {
                let d = &info.device;
                vec![
                    ("adapter".into(), d.name.clone()),
                    ("backend".into(), d.backend.clone()),
                    ("driver".into(), d.driver.clone()),
                    (
                        "memory".into(),
                        d.memory_bytes.map(format_bytes).unwrap_or_else(|| "not reported".into()),
                    ),
                    ("features".into(), d.features.join(", ")),
                    ("parameters".into(), info.parameters.to_string()),
                    ("notes".into(), info.notes.join("; ")),
                ]
            }
            None => vec![("adapter".into(), "?".into()), ("backend".into(), "?".into())],
        };
        let config: Vec<(String, String)> = config_of(&r).into_iter().filter(|(_, v)| v != "null").collect();
        let bench = r.bench.clone().unwrap_or_default();
        view! {
            <table id="device-table">
                {rows.into_iter().map(|(k, v)| view! { <tr><th>{k}</th><td>{v}</td></tr> }).collect_view()}
            </table>
            <details id="run-config"><summary>"Config"</summary>
                <table>{config.into_iter().map(|(k, v)| view! { <tr><th>{k}</th><td>{v}</td></tr> }).collect_view()}</table>
            </details>
            <h2 style="margin-top:10px">"Kernel timings (wgtrain bench)"</h2>
            {kernels::bench_table(bench)}
        }
    };
    view! {
        <section class="wide" id="training">
            <h2>"Training"</h2>
            <div class="controls">
                <label>"x axis "
                    <select id="x-axis" on:change=move |ev| {
                        axis.set(if event_target_value(&ev) == "wall" { XAxis::Wall } else { XAxis::Step });
                        zoom.set(None);
                    }>
                        <option value="step">"step"</option>
                        <option value="wall">"wall time"</option>
                    </select>
                </label>
                <label>"smoothing "
                    <input type="range" id="smoothing" min="0" max="0.99" step="0.01" prop:value=move || smoothing.get().to_string()
                        on:input=move |ev| smoothing.set(event_target_value(&ev).parse().unwrap_or(0.0)) />
                    {move || format!(" {:.2}", smoothing.get())}
                </label>
                <label><input type="checkbox" id="log-scale" on:change=move |ev| log_y.set(event_target_checked(&ev)) />" log scale (loss)"</label>
                {move || zoom.get().map(|_| view! { <button id="training-unzoom" on:click=move |_| zoom.set(None)>"reset zoom"</button> })}
                <span class="small">"drag across a chart to zoom"</span>
                {move || ctx.run_name.get().map(|n| view! {
                    <a id="curves-csv" href=api(&n, "/curves.csv") download>"download the curves (CSV)"</a>
                })}
            </div>
            <div class="controls" id="compare">"compare with: " {compare_list}</div>
            {charts}
            {diff}
            <div class="cols">
                <div><h2 style="margin-top:10px">"Device"</h2>{device}</div>
            </div>
        </section>
    }
}
