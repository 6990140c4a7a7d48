//! Memory per step: stacked by category at each step's peak, reserved as a dashed
//! line, the cap drawn, the peak marked; hovering shows a step's numbers and a click
//! opens that step in the peak, timeline and allocator views.
//!
//! May call: `charts`, `state`, `wgtrain_record`, leptos. Called by: the app.

use leptos::prelude::*;
use wgtrain_record::{Category, StepLog, format_bytes, short_bytes};

use crate::charts::{Brush, H, W, axes, byte_ticks, legend, step_byte_scales, x_span, y_span};
use crate::state::{Ctx, bytes, steps};

/// The memory chart (see the module).
#[component]
pub fn MemoryView(ctx: Ctx) -> impl IntoView {
    let hover = RwSignal::new(None::<usize>);
    let zoom = RwSignal::new(None::<(f64, f64)>);
    let data = Memo::new(move |_| steps(&ctx.lines.get()));
    let chart = move || {
        let all = data.get();
        let s: Vec<StepLog> = match zoom.get() {
            Some((a, b)) => all.into_iter().filter(|l| (l.step as f64) >= a && (l.step as f64) <= b).collect(),
            None => all,
        };
        let n = s.len();
        if n == 0 {
            return view! { <p class="empty">"waiting for the first step..."</p> }.into_any();
        }
        let mem = |l: &StepLog| l.mem.clone().unwrap_or_default();
        let peaks: Vec<f64> = s.iter().map(|l| mem(l).peak as f64).collect();
        let reserved: Vec<f64> = s.iter().map(|l| (mem(l).peak_reserved.max(mem(l).reserved)) as f64).collect();
        let cap = s
            .last()
            .and_then(|l| mem(l).cap)
            .or_else(|| ctx.run.get().info.and_then(|i| i.cap))
            .map(|c| c as f64);
        let top = reserved.iter().chain(&peaks).cloned().fold(0.0, f64::max);
        let cap_shown = cap.filter(|&c| c <= 2.0 * top);
        let ticks = byte_ticks(top.max(cap_shown.unwrap_or(0.0)) * 1.08);
        let ymax = (top.max(cap_shown.unwrap_or(0.0)) * 1.08).max(*ticks.last().unwrap_or(&1.0));
        let (x0, x1) = x_span();
        let (yt, yb) = y_span();
        let (first, last) = (s[0].step as f64, s[n - 1].step as f64);
        let (x, y) = step_byte_scales(first, last, ymax);
        let xs: Vec<f64> = s.iter().map(|l| x.at(l.step as f64)).collect();
        let mut below = vec![0.0; n];
        let mut areas = Vec::new();
        for category in Category::ALL {
            let (name, col) = (category.name(), category.colour());
            let vals: Vec<f64> = s
                .iter()
                .map(|l| l.mem.as_ref().and_then(|m| m.peak_by_category().get(name)).copied().unwrap_or(0) as f64)
                .collect();
            let mut d = String::new();
            for i in 0..n {
                d += &format!("{}{:.1},{:.1} ", if i == 0 { "M" } else { "L" }, xs[i], y.at(below[i] + vals[i]));
            }
            for i in (0..n).rev() {
                d += &format!("L{:.1},{:.1} ", xs[i], y.at(below[i]));
            }
            d += "Z";
            for i in 0..n {
                below[i] += vals[i];
            }
            areas.push(view! { <path d=d fill=col fill-opacity="0.85" data-category=name /> });
        }
        let reserved_d: String = reserved
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{}{:.1},{:.1} ", if i == 0 { "M" } else { "L" }, xs[i], y.at(*r)))
            .collect();
        let (pi, pv) = peaks
            .iter()
            .enumerate()
            .fold((0, 0.0), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
        let peak_step = s[pi].step;
        // Evaluation's own peak (its batches, no tape), which the steps' chart leaves out.
        let eval_peak = ctx
            .lines
            .get()
            .iter()
            .filter_map(|l| Some((l.step, l.eval.as_ref()?.peak?, l.eval.as_ref()?.reserved.unwrap_or(0))))
            .max_by_key(|e| e.1);
        let steps_at: Vec<u64> = s.iter().map(|l| l.step).collect();
        let index_at = move |ev: &web_sys::MouseEvent| -> Option<usize> {
            let px = Brush::svg_x(ev)?;
            let v = x.invert(px);
            steps_at
                .iter()
                .enumerate()
                .min_by(|a, b| (*a.1 as f64 - v).abs().total_cmp(&(*b.1 as f64 - v).abs()))
                .map(|(i, _)| i)
        };
        let index_click = index_at.clone();
        let clicked_steps: Vec<u64> = s.iter().map(|l| l.step).collect();
        let brush = Brush::new();
        let chosen = ctx.shown_step();
        let chosen_x = chosen.map(|c| x.at(c as f64)).filter(|p| *p >= x0 && *p <= x1);
        view! {
            <div class="facts">
                <span id="peak-value" data-peak-bytes=pv.to_string()>"peak " <b>{bytes(pv)}</b> {format!(" at step {peak_step}")}</span>
                <span>"reserved now " <b>{bytes(*reserved.last().unwrap_or(&0.0))}</b></span>
                {eval_peak.map(|(step, p, r)| view! {
                    <span id="eval-peak" data-bytes=p.to_string()>"evaluation peak " <b>{bytes(p as f64)}</b>
                        {format!(" at step {step}, reserved after it {}", bytes(r as f64))}</span>
                })}
                {cap.map(|c| view! { <span id="cap-value" data-cap-bytes=c.to_string()>"cap " <b>{bytes(c)}</b></span> })}
                <span class="hint">"click a step to open it; drag to zoom"</span>
                {move || zoom.get().map(|_| view! { <button id="memory-unzoom" on:click=move |_| zoom.set(None)>"reset zoom"</button> })}
            </div>
            <svg id="memory-chart" class="chart" viewBox=format!("0 0 {W} {H}") data-steps=n.to_string()
                on:mousemove=move |ev| { hover.set(index_at(&ev)); brush.moved(&ev); }
                on:mouseleave=move |_| hover.set(None)
                on:mousedown=move |ev| brush.down(&ev)
                on:mouseup=move |ev| {
                    match brush.up(&ev, x) {
                        Some((a, b)) => zoom.set(Some((a.floor(), b.ceil()))),
                        None => if let Some(i) = index_click(&ev) { ctx.choose(clicked_steps[i]) },
                    }
                }>
                {axes(x, y, short_bytes, ticks, "step".into())}
                {areas}
                <path d=reserved_d fill="none" stroke="#1d2330" stroke-width="1.5" stroke-dasharray="5,3" />
                {cap_shown.map(|c| view! {
                    <line x1=x0 x2=x1 y1=y.at(c) y2=y.at(c) stroke="#c0392b" stroke-width="1.5" />
                    <text x=x1 - 2.0 y=y.at(c) - 4.0 font-size="11" text-anchor="end" fill="#c0392b">"cap"</text>
                })}
                {chosen_x.map(|p| view! { <line id="chosen-step" x1=p x2=p y1=yt y2=yb stroke="#1d2330" stroke-width="2" stroke-opacity="0.5" data-step=chosen.unwrap_or(0).to_string() /> })}
                <circle id="peak-marker" cx=xs[pi] cy=y.at(pv) r="5" fill="#c0392b" data-step=peak_step.to_string() />
                <text x=xs[pi] y=y.at(pv) - 8.0 font-size="11" text-anchor="middle">"peak"</text>
                {move || hover.get().and_then(|i| xs.get(i).copied()).map(|p| view! { <line x1=p x2=p y1=yt y2=yb stroke="#555" /> })}
                {brush.view()}
            </svg>
            {legend()}
            <div class="tip" id="memory-tip">{move || hover.get().and_then(|i| s.get(i).cloned()).map(|l| {
                let m = l.mem.unwrap_or_default();
                let by = m.peak_by_category();
                let mut t = format!("step {}: peak {}, reserved {} (click to open)\n", l.step, format_bytes(m.peak), format_bytes(m.peak_reserved));
                for c in Category::ALL {
                    t += &format!("{c} {}  ", format_bytes(by.get(c.name()).copied().unwrap_or(0)));
                }
                t
            })}</div>
        }
        .into_any()
    };
    view! {
        <section class="wide" id="memory">
            <h2>"Memory per step (by category at each step's peak; dashed: reserved)"</h2>
            {chart}
        </section>
    }
}
