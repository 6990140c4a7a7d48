//! What fills memory at the chosen step's peak (by default the run's peak step): the
//! bytes by category and the largest blocks alive then, with the op that made each and
//! the phase it was made in; and what other memory policies would need, from the
//! exact estimate (`/api/runs/NAME/whatif`), against the cap or the device's memory, or
//! a budget the reader types ("will it fit in 8 GiB?").
//!
//! May call: `state`, `wgtrain_record`, leptos. Called by: the app.

use leptos::prelude::*;
use wgtrain_record::{Category, PeakView, WhatIfView, format_bytes, parse_bytes};

use crate::state::{Ctx, api, get_json};

/// Blocks listed before "show all".
const SHOWN: usize = 12;

/// The phase the step was in at allocator event `event`.
fn phase_at(t: &wgtrain_record::StepMemory, event: u64) -> String {
    t.phases
        .iter()
        .find(|p| p.start_seq <= event && event <= p.end_seq)
        .map_or_else(|| "start of the step".into(), |p| p.phase.clone())
}

/// What would shrink the largest category, in the engine's terms.
fn advice(p: &PeakView) -> Option<&'static str> {
    let (name, _) = p.by_category.iter().max_by_key(|(_, b)| **b)?;
    Some(match name.as_str() {
        "activation" => "activations lead: activation checkpointing, a smaller micro-batch, or fp16-mixed shrink them (see what-if)",
        "temporary" => "backward's temporaries lead: a smaller micro-batch or checkpointing shrink them (see what-if)",
        "optimizer_state" => "optimizer state leads: 8-bit AdamW keeps about a quarter of AdamW's and SGD half; on several devices ZeRO 1-3 shard it and parallel.offload moves it to the host (see what-if)",
        "gradient" => "gradients lead: optimizer-in-backward frees each as soon as it is applied (see what-if)",
        "parameter" => "parameters lead: on several devices ZeRO 3 shards them and parallel.offload = \"optimizer+parameters\" keeps them on the host; or a smaller model",
        _ => return None,
    })
}

/// A relative change as a whole signed percentage ("-0%" shown as "+0%").
fn percent_change(r: f64) -> String {
    let p = (100.0 * r).round();
    format!("{:+.0}%", if p == 0.0 { 0.0 } else { p })
}

/// The peak panel (see the module).
#[component]
pub fn PeakPanel(ctx: Ctx) -> impl IntoView {
    let all = RwSignal::new(false);
    // The blocks' search: a part of a label, any case (all matches shown).
    let query = RwSignal::new(String::new());
    let body = move || {
        let Some(t) = ctx.timeline.get() else {
            return view! { <p class="empty">"no step recorded yet"</p> }.into_any();
        };
        let p = t.peak();
        let total = p.peak_bytes.max(1) as f64;
        let chosen = ctx.chosen.get();
        let note = match chosen {
            Some(c) if c != p.step => format!(" (step {c} has no timeline kept; the nearest kept step)"),
            None => " (the run's peak step; click a step in the memory chart for another)".into(),
            _ => String::new(),
        };
        let bar = Category::ALL
            .iter()
            .filter_map(|c| {
                let b = *p.by_category.get(c.name())?;
                (b > 0).then(|| {
                    view! {
                        <div style=format!("width:{:.2}%;background:{}", 100.0 * b as f64 / total, c.colour())
                            title=format!("{} {}", c.name(), format_bytes(b))></div>
                    }
                })
            })
            .collect_view();
        let shares = p
            .by_category
            .iter()
            .filter(|(_, b)| **b > 0)
            .map(|(c, b)| format!("{c} {} ({:.0}%)", format_bytes(*b), 100.0 * *b as f64 / total))
            .collect::<Vec<_>>()
            .join(" · ");
        let top = p.blocks.first().cloned();
        let adv = advice(&p);
        let n = p.blocks.len();
        let rows = move || {
            let q = query.get().trim().to_lowercase();
            let shown = if all.get() || !q.is_empty() { n } else { n.min(SHOWN) };
            p.blocks
                .iter()
                .filter(|b| q.is_empty() || b.label.to_lowercase().contains(&q))
                .take(shown)
                .map(|b| {
                    view! {
                        <tr class="peak-block" data-label=b.label.clone()>
                            <td><span class="swatch" style=format!("background:{}", b.category.colour())></span>{b.label.clone()}</td>
                            <td>{b.category.name()}</td>
                            <td class="num">{format_bytes(b.size)}</td>
                            <td class="num">{format!("{:.1}%", 100.0 * b.size as f64 / total)}</td>
                            <td>{b.phase.clone()}</td>
                        </tr>
                    }
                })
                .collect_view()
        };
        view! {
            <div class="facts">
                <span>"step " <b id="peak-step">{p.step}</b>{note}</span>
                <span>"peak " <b id="peak-bytes" data-bytes=p.peak_bytes.to_string()>{format_bytes(p.peak_bytes)}</b></span>
                <span>"during " <b id="peak-phase">{phase_at(&t, p.event)}</b>{format!(" (allocator event {} of {})", p.event, t.events)}</span>
            </div>
            {top.map(|b| view! {
                <p class="headline" id="peak-top" data-label=b.label.clone()>
                    "largest: " <b>{b.label.clone()}</b>
                    {format!(" · {} · {} · made in {}", format_bytes(b.size), b.category.name(), b.phase)}
                </p>
            })}
            <div class="page" id="peak-bar">{bar}</div>
            <p class="small">{shares}</p>
            {adv.map(|a| view! { <p class="advice">{a}</p> })}
            <input id="peak-search" type="search" style="width:min(32em,100%)" placeholder=format!("search the {n} blocks (a layer's name, e.g. mlp.c_fc)")
                on:input=move |ev| query.set(event_target_value(&ev)) />
            <table id="peak-blocks">
                <tr><th>"block"</th><th>"category"</th><th class="num">"size"</th><th class="num">"of peak"</th><th>"made in"</th></tr>
                {rows}
            </table>
            {(n > SHOWN).then(|| view! {
                <button id="peak-all" on:click=move |_| all.update(|a| *a = !*a)>
                    {move || if all.get() { "show the largest".to_string() } else { format!("show all {n} blocks") }}
                </button>
            })}
        }
        .into_any()
    };
    view! {
        <section id="peak-panel">
            <h2>"What fills memory at the peak"</h2>
            {body}
        </section>
    }
}

/// The what-if panel (see the module).
#[component]
pub fn WhatIfPanel(ctx: Ctx) -> impl IntoView {
    let view_ = RwSignal::new(None::<Result<WhatIfView, String>>);
    // The reader's budget as typed; empty: the run's cap or device memory.
    let typed = RwSignal::new(String::new());
    Effect::new(move |_| {
        let Some(name) = ctx.run_name.get() else { return };
        // Again once the run's facts arrive (a live run sends them at its start).
        let _ = ctx.run.with(|r| r.info.is_some());
        leptos::task::spawn_local(async move {
            let got = get_json::<WhatIfView>(&api(&name, "/whatif")).await;
            if ctx.run_name.get_untracked().as_deref() == Some(name.as_str()) {
                view_.set(Some(got));
            }
        });
    });
    let body = move || match view_.get() {
        None if ctx.run_name.with(Option::is_none) => view! { <p class="empty">"no run selected"</p> }.into_any(),
        None => view! { <p class="empty">"estimating..."</p> }.into_any(),
        Some(Err(e)) => view! { <p class="empty">{e}</p> }.into_any(),
        Some(Ok(w)) if w.options.is_empty() => {
            view! { <p class="empty">"no estimates recorded for this run (runs record them when a dashboard or --log watches)"</p> }
                .into_any()
        }
        Some(Ok(w)) => {
            let budget = typed.with(|t| parse_bytes(t, u64::MAX));
            let limit = budget.or(w.limit_bytes);
            let base = w.options[0].peak_bytes.max(1) as f64;
            let most = w.options.iter().map(|o| o.peak_reserved_bytes).max().unwrap_or(1).max(1) as f64;
            // The bars span the options (and the limit when it is near them).
            let scale = match limit {
                Some(l) if (l as f64) < 1.5 * most => l as f64 * 1.05,
                _ => most * 1.05,
            };
            let limit_shown = limit.filter(|l| (*l as f64) <= scale);
            let get = |o: &wgtrain_record::WhatIf, k: &str| {
                o.policy
                    .get(k)
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .unwrap_or_default()
            };
            let rows = w
                .options
                .iter()
                .map(|o| {
                    let change = if o.change.is_empty() { "as run".to_string() } else { o.change.clone() };
                    let fits = budget.map(|b| o.peak_reserved_bytes <= b).or(o.fits);
                    let class = if fits == Some(false) { "nofit" } else { "" };
                    let fits = match fits {
                        Some(true) => "fits",
                        Some(false) => "does not fit",
                        None => "?",
                    };
                    view! {
                        <tr class=class data-change=o.change.clone() data-peak=o.peak_bytes.to_string() data-reserved=o.peak_reserved_bytes.to_string()>
                            <td>{change}</td>
                            <td class="num">{format_bytes(o.peak_bytes)}</td>
                            <td class="num">{format_bytes(o.peak_reserved_bytes)}</td>
                            <td class="num">{percent_change(o.peak_bytes as f64 / base - 1.0)}</td>
                            <td>{fits}</td>
                            <td class="barcell" title="solid: peak allocated; light: peak reserved">
                                <div class="hbar reserved" style=format!("width:{:.1}%", 100.0 * o.peak_reserved_bytes as f64 / scale)>
                                    <div class="hbar" style=format!("width:{:.1}%", 100.0 * o.peak_bytes as f64 / o.peak_reserved_bytes.max(1) as f64)></div>
                                </div>
                                {limit_shown.map(|l| view! { <div class="limit" style=format!("left:{:.1}%", 100.0 * l as f64 / scale)></div> })}</td>
                        </tr>
                    }
                })
                .collect_view();
            let run = &w.options[0];
            let as_run = ["precision", "checkpoint", "micro_batch_size", "optimizer_in_backward", "zero", "offload"]
                .iter()
                .filter(|k| run.policy.contains_key(**k))
                .map(|k| format!("{} {}", k.replace('_', " "), get(run, k)))
                .collect::<Vec<_>>()
                .join(", ");
            view! {
                <p class="small" id="whatif-run">{format!("as run: {as_run}")}</p>
                <p class="small">{match limit {
                    Some(l) => format!("estimated peaks of this run's config with one memory setting changed (and the two that cut activations most, together); \"fits\": reserved within {} ({}{})",
                        format_bytes(l), if budget.is_some() { "the budget typed below" } else { "the cap, else the device's memory" },
                        if limit_shown.is_some() { ", the red line" } else { "" }),
                    None => "estimated peaks of this run's config with one memory setting changed (and the two that cut activations most, together)".to_string(),
                }}</p>
                <table id="whatif-table">
                    <tr><th>"change"</th><th class="num">"peak"</th><th class="num">"reserved"</th><th class="num">"peak vs run"</th><th>"fits"</th><th>"peak / reserved"</th></tr>
                    {rows}
                </table>
            }
            .into_any()
        }
    };
    let bad = move || typed.with(|t| !t.trim().is_empty() && parse_bytes(t, u64::MAX).is_none());
    view! {
        <section id="whatif">
            <h2>"What if: other memory policies (exact estimate)"</h2>
            {body}
            <p class="small">
                <label>"Will it fit in "
                    <input id="whatif-budget" type="text" size="10" placeholder="e.g. 8 GiB"
                        prop:value=move || typed.get()
                        on:input=move |ev| typed.set(event_target_value(&ev)) />
                </label>
                {move || bad().then(|| view! { <span class="nofit">" not a size (like 8 GiB, 5.4 GB, 512 MiB)"</span> })}
            </p>
        </section>
    }
}
