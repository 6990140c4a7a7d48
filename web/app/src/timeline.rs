//! Inside one step: each block a band over the step's allocator events, stacked as
//! memory_viz's Active Memory Timeline stacks them, the phases (forward, backward,
//! recompute, optimizer) shaded behind, the peak marked; under it the same step's
//! kernel table where the step was profiled. Beside it the allocator's pages at that
//! step's peak (or at its end): each page a bar of its blocks.
//!
//! May call: `charts`, `kernels`, `state`, `wgtrain_record`, leptos. Called
//! by: the app.

use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wgtrain_record::{Category, PageView, StepMemory, format_bytes, short_bytes};

use crate::charts::{H, Scale, W, axes, byte_ticks, legend, x_span, y_span};
use crate::kernels;
use crate::state::{Ctx, encode, token_query};

const FREE: &str = "#d9dce3";

/// A phase's shade.
fn phase_colour(phase: &str) -> &'static str {
    match phase {
        "forward" => "#e6f0fa",
        "backward" => "#fbe9e7",
        "recompute" => "#fff3dc",
        "optimizer" => "#e7f5e6",
        _ => "#f1f1f3",
    }
}

/// The timeline view (see the module).
#[component]
pub fn TimelineView(ctx: Ctx) -> impl IntoView {
    let hover = RwSignal::new(None::<usize>);
    let pick = move |ev: web_sys::Event| {
        if let Some(sel) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlSelectElement>().ok())
            && let Ok(s) = sel.value().parse()
        {
            ctx.choose(s);
        }
    };
    let chart = move || {
        let Some(t) = ctx.timeline.get() else {
            return view! { <p class="empty">"no step recorded yet"</p> }.into_any();
        };
        let bands = t.bands.clone();
        let events = t.events as f64 + 1.0;
        let ms = t.duration_us as f64 / 1000.0;
        let mut times: Vec<u64> = bands.iter().flat_map(|b| [b.start_seq, b.end_seq]).collect();
        times.sort_unstable();
        times.dedup();
        // Sweep: at each instant the live bands stack in allocation order.
        let mut tops: Vec<Vec<(f64, f64)>> = vec![Vec::new(); bands.len()];
        let mut max = 0.0f64;
        for &tm in &times {
            let mut y = 0.0;
            for (i, b) in bands.iter().enumerate() {
                if b.start_seq <= tm && tm < b.end_seq {
                    tops[i].push((tm as f64, y));
                    y += b.size as f64;
                }
            }
            max = max.max(y);
        }
        let ticks = byte_ticks(max * 1.05);
        let (x0, x1) = x_span();
        let (yt, yb) = y_span();
        let x = Scale {
            lo: 0.0,
            hi: events,
            a: x0,
            b: x1,
            log: false,
        };
        let y = Scale {
            lo: 0.0,
            hi: (max * 1.05).max(*ticks.last().unwrap_or(&1.0)),
            a: yb,
            b: yt,
            log: false,
        };
        let shades = t
            .phases
            .iter()
            .map(|p| {
                let (a, b) = (x.at(p.start_seq as f64 - 0.5), x.at(p.end_seq as f64 + 0.5));
                view! {
                    <rect class="phase" x=a y=yt width=(b - a).max(0.5) height=yb - yt fill=phase_colour(&p.phase) data-phase=p.phase.clone() />
                    {(b - a > 40.0).then(|| view! { <text x=(a + b) / 2.0 y=yt + 10.0 font-size="10" text-anchor="middle" fill="#667">{p.phase.clone()}</text> })}
                }
            })
            .collect_view();
        let polys = bands
            .iter()
            .zip(&tops)
            .enumerate()
            .filter(|(_, (_, pts))| !pts.is_empty())
            .map(|(i, (b, pts))| {
                let size = b.size as f64;
                let end = b.end_seq as f64;
                let mut upper = Vec::new();
                let mut lower = Vec::new();
                for (k, &(tm, yv)) in pts.iter().enumerate() {
                    let next = pts.get(k + 1).map_or(end, |p| p.0);
                    lower.push(format!("{:.1},{:.1} {:.1},{:.1}", x.at(tm), y.at(yv), x.at(next), y.at(yv)));
                    upper.push(format!(
                        "{:.1},{:.1} {:.1},{:.1}",
                        x.at(next),
                        y.at(yv + size),
                        x.at(tm),
                        y.at(yv + size)
                    ));
                }
                upper.reverse();
                let points = format!("{} {}", lower.join(" "), upper.join(" "));
                let info = format!(
                    "{} · {} · {} · {}",
                    b.label,
                    format_bytes(b.size),
                    b.category,
                    if b.phase.is_empty() {
                        "alive before the step"
                    } else {
                        b.phase.as_str()
                    }
                );
                view! {
                    <polygon points=points fill=b.category.colour()
                        stroke=move || if hover.get() == Some(i) { "#1d2330" } else { "#fff" }
                        stroke-width=move || if hover.get() == Some(i) { "1.5" } else { "0.3" }
                        on:mouseenter=move |_| hover.set(Some(i))>
                        <title>{info}</title>
                    </polygon>
                }
            })
            .collect_view();
        let peak = t.peak();
        let px = x.at(peak.event as f64);
        let ooms = t.ooms.len();
        let tip_bands = bands.clone();
        view! {
            <svg id="timeline-chart" class="chart" viewBox=format!("0 0 {W} {H}") data-bands=bands.len().to_string() data-step=t.step.to_string()
                on:mouseleave=move |_| hover.set(None)>
                {shades}
                {axes(x, y, short_bytes, ticks, format!("allocator events in step {} ({} events, {ms:.1} ms)", t.step, t.events))}
                {polys}
                <line x1=px x2=px y1=yt y2=yb stroke="#c0392b" stroke-dasharray="3,2" />
                <text x=px y=yt + 22.0 font-size="10" text-anchor="middle" fill="#c0392b">"peak"</text>
            </svg>
            {legend()}
            <div class="tip" id="timeline-tip">{move || hover.get().and_then(|i| tip_bands.get(i)).map(|b| format!(
                "{} · {} · {} · {}", b.label, format_bytes(b.size), b.category,
                if b.phase.is_empty() { "alive before the step" } else { b.phase.as_str() }))}</div>
            {(ooms > 0).then(|| view! { <div class="events">{format!("{ooms} out-of-memory events in this step")}</div> })}
        }
        .into_any()
    };
    let shown = Memo::new(move |_| ctx.shown_step());
    view! {
        <section class="wide" id="timeline">
            <h2>"Inside one step: allocation timeline"</h2>
            <label>"step "
                <select id="step-select" on:change=pick>
                    {move || ctx.timeline_steps.get().into_iter().map(|s| {
                        let selected = shown.get() == Some(s);
                        view! { <option value=s.to_string() selected=selected>{s.to_string()}</option> }
                    }).collect_view()}
                </select>
            </label>
            <span class="small">" (kept: the first steps, the latest ones, and the peak step)"</span>
            {chart}
            <kernels::StepKernels lines=ctx.lines chosen=shown />
        </section>
    }
}

/// The pages as they were at `t`'s peak: each page of the step's end with the blocks
/// alive at the peak placed at their offsets, the rest free.
fn pages_at_peak(t: &StepMemory) -> Vec<PageView> {
    let at = t.peak().event;
    t.pages
        .iter()
        .map(|p| {
            let mut live: Vec<&wgtrain_record::Band> = t
                .bands
                .iter()
                .filter(|b| b.page == Some(p.id) && b.start_seq <= at && at < b.end_seq)
                .collect();
            live.sort_by_key(|b| b.offset);
            let mut blocks = Vec::new();
            let mut pos = 0;
            let free = |offset: u64, size: u64| wgtrain_record::BlockView {
                offset,
                size,
                allocated: false,
                requested: 0,
                category: None,
                label: None,
                alloc: None,
            };
            for b in live {
                if b.offset > pos {
                    blocks.push(free(pos, b.offset - pos));
                }
                blocks.push(wgtrain_record::BlockView {
                    offset: b.offset,
                    size: b.size,
                    allocated: true,
                    requested: b.requested,
                    category: Some(b.category),
                    label: Some(b.label.clone()),
                    alloc: None,
                });
                pos = b.offset + b.size;
            }
            if pos < p.size {
                blocks.push(free(pos, p.size - pos));
            }
            PageView { blocks, ..p.clone() }
        })
        .collect()
}

/// The allocator's pages at the shown step's peak or end, fragmentation, the largest
/// free block, out-of-memory events and retries.
#[component]
pub fn AllocatorView(ctx: Ctx) -> impl IntoView {
    let at_end = RwSignal::new(false);
    let name = move || ctx.run_name.get().unwrap_or_default();
    let body = move || {
        let l = ctx.lines.get();
        let t = ctx.timeline.get();
        let (pages, when) = match (&t, at_end.get()) {
            (Some(t), false) => (pages_at_peak(t), format!("at step {}'s peak", t.step)),
            (Some(t), true) => (t.pages.clone(), format!("at step {}'s end", t.step)),
            (None, _) => (ctx.run.get().pages, "after the latest step".to_string()),
        };
        let m = t
            .as_ref()
            .and_then(|t| l.iter().find(|x| x.step == t.step))
            .or_else(|| l.iter().rev().find(|x| x.is_step()))
            .and_then(|s| s.mem.clone())
            .unwrap_or_default();
        let largest = pages
            .iter()
            .flat_map(|p| p.blocks.iter())
            .filter(|b| !b.allocated)
            .map(|b| b.size)
            .max()
            .unwrap_or(0);
        let used_total: u64 = pages
            .iter()
            .flat_map(|p| p.blocks.iter())
            .filter(|b| b.allocated)
            .map(|b| b.size)
            .sum();
        let events: Vec<String> = l
            .iter()
            .filter_map(|x| x.event.as_ref().map(|e| format!("step {}: {e}", x.step)))
            .collect();
        let rows = pages
            .iter()
            .map(|p| {
                let size = (p.size as f64).max(1.0);
                let used: u64 = p.blocks.iter().filter(|b| b.allocated).map(|b| b.size).sum();
                let cells = p
                    .blocks
                    .iter()
                    .map(|b| {
                        let category = b.category.unwrap_or(Category::Other);
                        let c = if b.allocated { category.colour() } else { FREE };
                        let title = if b.allocated {
                            format!("{} · {} · {}", b.label.as_deref().unwrap_or(""), format_bytes(b.size), category)
                        } else {
                            format!("free · {}", format_bytes(b.size))
                        };
                        view! { <div style=format!("width:{:.3}%;background:{c}", 100.0 * b.size as f64 / size) title=title></div> }
                    })
                    .collect_view();
                view! {
                    <div class="pagelabel">{format!("page {} · {} · {} · {} used", p.id, p.pool.name(), format_bytes(p.size), format_bytes(used))}</div>
                    <div class="page">{cells}</div>
                }
            })
            .collect_view();
        view! {
            <div class="facts">
                <span id="pages-when">{when}</span>
                <span>"pages " <b id="page-count">{pages.len()}</b></span>
                <span>"in use " <b id="pages-used" data-bytes=used_total.to_string()>{format_bytes(used_total)}</b></span>
                <span>"largest free block " <b>{format_bytes(largest)}</b></span>
                <span>"fragmentation " <b>{format!("{:.1}%", 100.0 * m.fragmentation)}</b></span>
                <span>"OOMs " <b>{m.num_ooms}</b></span>
                <span>"retries " <b>{m.num_alloc_retries}</b></span>
            </div>
            {rows}
            <div class="events">{events.join("\n")}</div>
        }
    };
    let export = move |kind: &str| {
        let step = ctx.timeline.get().map(|t| format!("?step={}", t.step)).unwrap_or_default();
        let q = if step.is_empty() {
            token_query(true)
        } else {
            format!("{step}{}", token_query(false))
        };
        format!("/api/runs/{}/snapshot.{kind}{q}", encode(&name()))
    };
    view! {
        <section id="allocator">
            <h2>"Allocator pages"</h2>
            <div class="controls">
                <label><input type="checkbox" id="pages-at-end" on:change=move |ev| at_end.set(event_target_checked(&ev)) />" at the step's end instead of its peak"</label>
                <a class="export" href=move || export("json")>"export JSON"</a>
                <a class="export" id="export-pickle" href=move || export("pickle")>"export memory_viz pickle"</a>
            </div>
            {body}
        </section>
    }
}
