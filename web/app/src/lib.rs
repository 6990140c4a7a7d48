//! The dashboard app (Leptos, client-side rendered): reads a run from the server's API,
//! follows a live run over server-sent events, and draws four views as SVG: memory per
//! step (stacked by category at each step's peak), one step's allocation timeline, the
//! allocator's pages, and training curves with device facts and kernel timings; a
//! profiled step's kernel table sits under its timeline (`kernels`). The
//! data it reads are the protocol's types (`wgtrain_protocol`), the same the trainer
//! and the server write.
//!
//! May call: `wgtrain_protocol`, leptos, web-sys, gloo-net. Called by: the browser.

mod kernels;

use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wgtrain_protocol::{Category, Frame, RunEntry, RunView, StepLog, StepMemory, format_bytes, short_bytes};

const FREE: &str = "#d9dce3";
const W: f64 = 900.0;
const H: f64 = 260.0;
const PAD: f64 = 72.0;

/// Bytes as the engine prints them (binary units), from a chart value.
fn bytes(n: f64) -> String {
    format_bytes(n.max(0.0).round() as u64)
}

/// The token in this page's address, to pass on to the API.
fn token_query(first: bool) -> String {
    let search = web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default();
    let token = web_sys::UrlSearchParams::new_with_str(&search).ok().and_then(|p| p.get("token"));
    match token {
        Some(t) => format!("{}token={}", if first { "?" } else { "&" }, encode(&t)),
        None => String::new(),
    }
}

/// Percent-encodes `s` for a URL path segment or query value: every byte of its UTF-8
/// outside the unreserved set (names with spaces or accents, tokens with '&' or '+').
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn query_param(name: &str) -> Option<String> {
    let search = web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default();
    web_sys::UrlSearchParams::new_with_str(&search).ok().and_then(|p| p.get(name))
}

/// The server's error body.
#[derive(serde::Deserialize)]
struct ApiError {
    error: String,
}

async fn get_json<T: serde::de::DeserializeOwned>(url: &str) -> Result<T, String> {
    let resp = gloo_net::http::Request::get(url).send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(serde_json::from_str::<ApiError>(&text).map_or_else(|_| "request failed".to_string(), |e| e.error));
    }
    serde_json::from_str(&text).map_err(|e| format!("unexpected answer from {url}: {e}"))
}

/// Step lines (those with memory) of a run.
fn steps(lines: &[StepLog]) -> Vec<StepLog> {
    lines.iter().filter(|l| l.is_step()).cloned().collect()
}

#[wasm_bindgen(start)]
pub fn start() {
    leptos::mount::mount_to_body(App);
}

#[component]
fn App() -> impl IntoView {
    let run_name = RwSignal::new(None::<String>);
    let run = RwSignal::new(RunView::default());
    let lines = RwSignal::new(Vec::<StepLog>::new());
    let timeline_steps = RwSignal::new(Vec::<u64>::new());
    let live = RwSignal::new(false);
    let dropped = RwSignal::new(0u64);
    let error = RwSignal::new(None::<String>);
    let runs = RwSignal::new(Vec::<RunEntry>::new());

    // Which run: ?run=NAME, else the live one, else the first.
    leptos::task::spawn_local(async move {
        match get_json::<Vec<RunEntry>>(&format!("/api/runs{}", token_query(true))).await {
            Ok(list) => {
                let wanted = query_param("run").or_else(|| list.iter().find(|r| r.live).or(list.first()).map(|r| r.name.clone()));
                runs.set(list);
                match wanted {
                    Some(n) => run_name.set(Some(n)),
                    None => error.set(Some("no runs to show".into())),
                }
            }
            Err(e) => error.set(Some(e)),
        }
    });

    Effect::new(move |_| {
        let Some(name) = run_name.get() else { return };
        leptos::task::spawn_local(async move {
            match get_json::<RunView>(&format!("/api/runs/{}{}", encode(&name), token_query(true))).await {
                Ok(v) => {
                    lines.set(v.lines.clone());
                    timeline_steps.set(v.timeline_steps.clone());
                    let is_live = v.live && !v.finished;
                    live.set(is_live);
                    run.set(v);
                    if is_live {
                        follow(&name, lines, timeline_steps, run, live, dropped);
                    }
                }
                Err(e) => error.set(Some(e)),
            }
        });
    });

    let status = move || {
        let n = steps(&lines.get()).len();
        let state = if live.get() { "live" } else { "finished" };
        format!("{n} steps · {state} · dropped frames {}", dropped.get())
    };
    let select_run = move |ev: web_sys::Event| {
        if let Some(sel) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlSelectElement>().ok()) {
            run_name.set(Some(sel.value()));
        }
    };
    view! {
        <header>
            <h1>"wgtrain"</h1>
            <select id="run-select" on:change=select_run>
                {move || runs.get().into_iter().map(|r| {
                    let n = r.name;
                    let selected = run_name.get().as_deref() == Some(n.as_str());
                    view! { <option value=n.clone() selected=selected>{n.clone()}</option> }
                }).collect_view()}
            </select>
            <span class="status" id="status">{status}</span>
        </header>
        {move || error.get().map(|e| view! { <div class="error" id="error">{e}</div> })}
        <main>
            <MemoryView lines=lines run=run />
            <TimelineView run_name=run_name steps=timeline_steps lines=lines />
            <AllocatorView lines=lines run=run />
            <TrainingView lines=lines run=run />
        </main>
    }
}

/// Subscribes to the live stream of `name`.
fn follow(
    name: &str,
    lines: RwSignal<Vec<StepLog>>,
    tsteps: RwSignal<Vec<u64>>,
    run: RwSignal<RunView>,
    live: RwSignal<bool>,
    dropped: RwSignal<u64>,
) {
    let Ok(source) = web_sys::EventSource::new(&format!("/api/runs/{}/stream{}", encode(name), token_query(true))) else {
        return;
    };
    let known = lines.get_untracked().len();
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
        let Some(text) = ev.data().as_string() else { return };
        let Ok(frame) = serde_json::from_str::<Frame>(&text) else { return };
        match frame {
            Frame::Line { line, timeline, pages } => {
                if let Some(pages) = pages {
                    run.update(|r| r.pages = pages);
                }
                let step = line.step;
                lines.update(|l| {
                    // Frames sent before the first read are already in it.
                    if l.len() >= known && !l.contains(&line) {
                        l.push(line)
                    }
                });
                if timeline {
                    tsteps.update(|t| {
                        if !t.contains(&step) {
                            t.push(step)
                        }
                    });
                }
            }
            Frame::Info { info } => run.update(|r| r.info = Some(info)),
            Frame::Finished => live.set(false),
        }
    });
    source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_dropped = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
        let n: u64 = ev.data().as_string().and_then(|s| s.parse().ok()).unwrap_or(0);
        dropped.update(|d| *d += n);
    });
    let _ = source.add_event_listener_with_callback("dropped", on_dropped.as_ref().unchecked_ref());
    on_dropped.forget();
}

fn legend() -> impl IntoView {
    view! {
        <div class="legend">
            {Category::ALL.iter().map(|c| view! { <span style=format!("--c:{}", c.colour())>{c.name()}</span> }).collect_view()}
        </div>
    }
}

/// x position of point `i` of `n` across the plot.
fn px(i: usize, n: usize) -> f64 {
    if n <= 1 {
        PAD
    } else {
        PAD + (W - PAD - 10.0) * i as f64 / (n - 1) as f64
    }
}

fn py(v: f64, max: f64) -> f64 {
    H - 24.0 - (H - 40.0) * (v / max.max(1.0))
}

fn axis(max: f64, fmt: fn(f64) -> String) -> impl IntoView {
    (0..=4)
        .map(|i| {
            let v = max * i as f64 / 4.0;
            let y = py(v, max);
            view! {
                <line x1=PAD x2=W - 10.0 y1=y y2=y stroke="#e3e5ea" />
                <text x=PAD - 4.0 y=y + 4.0 font-size="10" text-anchor="end">{fmt(v)}</text>
            }
        })
        .collect_view()
}

/// Memory per step: stacked by category at each step's peak, reserved as a line, the
/// peak marked, the cap drawn; hovering shows the step's numbers.
#[component]
fn MemoryView(lines: RwSignal<Vec<StepLog>>, run: RwSignal<RunView>) -> impl IntoView {
    let hover = RwSignal::new(None::<usize>);
    let data = Memo::new(move |_| steps(&lines.get()));
    let chart = move || {
        let s = data.get();
        let n = s.len();
        if n == 0 {
            return view! { <p>"waiting for the first step..."</p> }.into_any();
        }
        let parts = |l: &StepLog| -> Vec<f64> {
            let by = l.mem.as_ref().map(|m| m.peak_by_category());
            Category::ALL
                .iter()
                .map(|c| by.and_then(|b| b.get(c.name())).copied().unwrap_or(0) as f64)
                .collect()
        };
        let mem = |l: &StepLog| l.mem.clone().unwrap_or_default();
        let peaks: Vec<f64> = s.iter().map(|l| mem(l).peak as f64).collect();
        let reserved: Vec<f64> = s.iter().map(|l| (mem(l).peak_reserved.max(mem(l).reserved)) as f64).collect();
        let cap = s
            .last()
            .and_then(|l| mem(l).cap)
            .or_else(|| run.get().info.and_then(|i| i.cap))
            .map(|c| c as f64);
        let top = reserved.iter().chain(&peaks).cloned().fold(0.0, f64::max);
        let cap_shown = cap.filter(|&c| c <= 2.0 * top);
        let max = top.max(cap_shown.unwrap_or(0.0)) * 1.08;
        let mut below = vec![0.0; n];
        let mut areas = Vec::new();
        for (k, category) in Category::ALL.iter().enumerate() {
            let (name, col) = (category.name(), category.colour());
            let vals: Vec<f64> = s.iter().map(|l| parts(l)[k]).collect();
            let mut d = String::new();
            for i in 0..n {
                d += &format!(
                    "{}{:.1},{:.1} ",
                    if i == 0 { "M" } else { "L" },
                    px(i, n),
                    py(below[i] + vals[i], max)
                );
            }
            for i in (0..n).rev() {
                d += &format!("L{:.1},{:.1} ", px(i, n), py(below[i], max));
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
            .map(|(i, r)| format!("{}{:.1},{:.1} ", if i == 0 { "M" } else { "L" }, px(i, n), py(*r, max)))
            .collect();
        let (pi, pv) = peaks
            .iter()
            .enumerate()
            .fold((0, 0.0), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
        let peak_step = s[pi].step;
        let on_move = move |ev: web_sys::MouseEvent| {
            let Some(el) = ev.current_target().and_then(|t| t.dyn_into::<web_sys::Element>().ok()) else {
                return;
            };
            let rect = el.get_bounding_client_rect();
            let x = (ev.client_x() as f64 - rect.left()) / rect.width().max(1.0) * W;
            let i = if n <= 1 {
                0.0
            } else {
                ((x - PAD) / (W - PAD - 10.0) * (n - 1) as f64).round()
            };
            hover.set(Some(i.clamp(0.0, (n - 1) as f64) as usize));
        };
        view! {
            <div class="facts">
                <span id="peak-value" data-peak-bytes=pv.to_string()>"peak " <b>{bytes(pv)}</b> {format!(" at step {peak_step}")}</span>
                <span>"reserved now " <b>{bytes(*reserved.last().unwrap_or(&0.0))}</b></span>
                {cap.map(|c| view! { <span id="cap-value" data-cap-bytes=c.to_string()>"cap " <b>{bytes(c)}</b></span> })}
            </div>
            <svg id="memory-chart" viewBox=format!("0 0 {W} {H}") data-steps=n.to_string() on:mousemove=on_move on:mouseleave=move |_| hover.set(None)>
                {axis(max, short_bytes)}
                {areas}
                <path d=reserved_d fill="none" stroke="#1d2330" stroke-width="1.5" stroke-dasharray="5,3" />
                {cap_shown.map(|c| view! {
                    <line x1=PAD x2=W - 10.0 y1=py(c, max) y2=py(c, max) stroke="#c0392b" stroke-width="1.5" />
                    <text x=W - 12.0 y=py(c, max) - 4.0 font-size="11" text-anchor="end" fill="#c0392b">"cap"</text>
                })}
                <circle cx=px(pi, n) cy=py(pv, max) r="4" fill="#c0392b" />
                <text x=px(pi, n) y=py(pv, max) - 8.0 font-size="11" text-anchor="middle">"peak"</text>
                {move || hover.get().map(|i| view! { <line x1=px(i, n) x2=px(i, n) y1="16" y2=H - 24.0 stroke="#555" /> })}
                <text x=W / 2.0 y=H - 4.0 font-size="11" text-anchor="middle">"step"</text>
            </svg>
            {legend()}
            <div class="tip" id="memory-tip">{move || hover.get().and_then(|i| data.get().get(i).cloned()).map(|l| {
                let m = l.mem.unwrap_or_default();
                let by = m.peak_by_category();
                let mut t = format!("step {}: peak {}, reserved {}\n", l.step, format_bytes(m.peak), format_bytes(m.peak_reserved));
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

/// Inside one step: each block a band over time, stacked as memory_viz's Active Memory
/// Timeline stacks them (a block sits on the blocks allocated before it); under it the
/// same step's kernel table where the step was profiled.
#[component]
fn TimelineView(run_name: RwSignal<Option<String>>, steps: RwSignal<Vec<u64>>, lines: RwSignal<Vec<StepLog>>) -> impl IntoView {
    let chosen = RwSignal::new(None::<u64>);
    let picked = RwSignal::new(false);
    let timeline = RwSignal::new(None::<StepMemory>);
    let hover = RwSignal::new(String::new());
    Effect::new(move |_| {
        // Follow the latest step until the user picks one.
        let latest = steps.get().iter().max().copied();
        if !picked.get_untracked() && latest.is_some() && latest != chosen.get_untracked() {
            chosen.set(latest);
        }
    });
    // One fetch at a time: a fast run does not queue up requests.
    let inflight = RwSignal::new(false);
    Effect::new(move |_| {
        let (Some(name), Some(step)) = (run_name.get(), chosen.get()) else {
            return;
        };
        if inflight.get_untracked() {
            return;
        }
        inflight.set(true);
        leptos::task::spawn_local(async move {
            if let Ok(v) = get_json::<StepMemory>(&format!("/api/runs/{}/timeline?step={step}{}", encode(&name), token_query(false))).await
            {
                timeline.set(Some(v));
            }
            inflight.set(false);
        });
    });
    let pick = move |ev: web_sys::Event| {
        if let Some(sel) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlSelectElement>().ok()) {
            picked.set(true);
            chosen.set(sel.value().parse().ok());
        }
    };
    let chart = move || {
        let Some(t) = timeline.get() else {
            return view! { <p>"no step recorded yet"</p> }.into_any();
        };
        let bands = &t.bands;
        // The x axis is the step's allocator events in order, as in memory_viz: CPU time
        // would crowd every allocation into the moment the launches were recorded.
        let duration = t.events as f64 + 1.0;
        let ms = t.duration_us as f64 / 1000.0;
        let mut times: Vec<f64> = bands.iter().flat_map(|b| [b.start_seq as f64, b.end_seq as f64]).collect();
        times.sort_by(f64::total_cmp);
        times.dedup();
        // Sweep: at each instant the live bands stack in allocation order.
        let mut tops: Vec<Vec<(f64, f64)>> = vec![Vec::new(); bands.len()];
        let mut max = 0.0f64;
        for &tm in &times {
            let mut y = 0.0;
            for (i, b) in bands.iter().enumerate() {
                if b.start_seq as f64 <= tm && tm < b.end_seq as f64 {
                    tops[i].push((tm, y));
                    y += b.size as f64;
                }
            }
            max = max.max(y);
        }
        let max = max * 1.05;
        let x = move |tm: f64| PAD + (W - PAD - 10.0) * tm / duration;
        let polys = bands
            .iter()
            .zip(&tops)
            .filter(|(_, pts)| !pts.is_empty())
            .map(|(b, pts)| {
                let size = b.size as f64;
                let end = b.end_seq as f64;
                let mut upper = Vec::new();
                let mut lower = Vec::new();
                for (k, &(tm, y)) in pts.iter().enumerate() {
                    let next = pts.get(k + 1).map_or(end, |p| p.0);
                    lower.push(format!("{:.1},{:.1} {:.1},{:.1}", x(tm), py(y, max), x(next), py(y, max)));
                    upper.push(format!("{:.1},{:.1} {:.1},{:.1}", x(next), py(y + size, max), x(tm), py(y + size, max)));
                }
                upper.reverse();
                let points = format!("{} {}", lower.join(" "), upper.join(" "));
                let cat = b.category;
                let info = format!("{} · {} · {}", b.label, format_bytes(b.size), cat);
                let info2 = info.clone();
                view! {
                    <polygon points=points fill=cat.colour() stroke="#fff" stroke-width="0.3" on:mouseenter=move |_| hover.set(info2.clone())>
                        <title>{info}</title>
                    </polygon>
                }
            })
            .collect_view();
        let ooms = t.ooms.len();
        view! {
            <svg id="timeline-chart" viewBox=format!("0 0 {W} {H}") data-bands=bands.len().to_string()>
                {axis(max, short_bytes)}
                {polys}
                <text x=W / 2.0 y=H - 4.0 font-size="11" text-anchor="middle">{format!("allocator events in the step ({} events, {ms:.1} ms)", duration - 1.0)}</text>
            </svg>
            {legend()}
            <div class="tip" id="timeline-tip">{move || hover.get()}</div>
            {(ooms > 0).then(|| view! { <div class="events">{format!("{ooms} out-of-memory events in this step")}</div> })}
        }
        .into_any()
    };
    view! {
        <section class="wide" id="timeline">
            <h2>"Inside one step: allocation timeline"</h2>
            <label>"step "
                <select id="step-select" on:change=pick>
                    {move || steps.get().into_iter().map(|s| {
                        let selected = chosen.get() == Some(s);
                        view! { <option value=s.to_string() selected=selected>{s.to_string()}</option> }
                    }).collect_view()}
                </select>
            </label>
            {chart}
            <kernels::StepKernels lines=lines chosen=chosen />
        </section>
    }
}

/// The allocator now: each page a bar of its blocks (used by category, free in grey),
/// fragmentation, the largest free block, out-of-memory events and retries.
#[component]
fn AllocatorView(lines: RwSignal<Vec<StepLog>>, run: RwSignal<RunView>) -> impl IntoView {
    let name = move || run.get().name;
    let body = move || {
        let r = run.get();
        let l = lines.get();
        let m = steps(&l).last().and_then(|s| s.mem.clone()).unwrap_or_default();
        // Live runs carry pages in the record only at load; the latest timeline has them too.
        let pages = r.pages;
        let largest = pages
            .iter()
            .flat_map(|p| p.blocks.iter())
            .filter(|b| !b.allocated)
            .map(|b| b.size)
            .max()
            .unwrap_or(0);
        let events: Vec<String> = l
            .iter()
            .filter_map(|x| x.event.as_ref().map(|e| format!("step {}: {e}", x.step)))
            .collect();
        let rows = pages
            .iter()
            .map(|p| {
                let size = (p.size as f64).max(1.0);
                let blocks = &p.blocks;
                let used: u64 = blocks.iter().filter(|b| b.allocated).map(|b| b.size).sum();
                let cells = blocks
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
                    <div class="pagelabel">{format!("page {} · {} · {} · {} blocks · {} used", p.id, p.pool.name(), format_bytes(p.size), blocks.len(), format_bytes(used))}</div>
                    <div class="page">{cells}</div>
                }
            })
            .collect_view();
        view! {
            <div class="facts">
                <span>"pages " <b id="page-count">{pages.len()}</b></span>
                <span>"fragmentation " <b>{format!("{:.1}%", 100.0 * m.fragmentation)}</b></span>
                <span>"largest free block " <b>{format_bytes(largest)}</b></span>
                <span>"OOMs " <b>{m.num_ooms}</b></span>
                <span>"retries " <b>{m.num_alloc_retries}</b></span>
            </div>
            {rows}
            <div class="events">{events.join("\n")}</div>
        }
    };
    view! {
        <section id="allocator">
            <h2>"Allocator pages"</h2>
            <div>
                <a class="export" href=move || format!("/api/runs/{}/snapshot.json{}", encode(&name()), token_query(true))>"export JSON"</a>
                <a class="export" href=move || format!("/api/runs/{}/snapshot.pickle{}", encode(&name()), token_query(true))>"export memory_viz pickle"</a>
            </div>
            {body}
        </section>
    }
}

fn line_chart(id: &'static str, series: Vec<(Vec<(f64, f64)>, &'static str)>, fmt: fn(f64) -> String, marks: Vec<f64>) -> impl IntoView {
    let xmax = series.iter().flat_map(|s| s.0.iter().map(|p| p.0)).fold(1.0, f64::max);
    let ymax = series.iter().flat_map(|s| s.0.iter().map(|p| p.1)).fold(0.0, f64::max) * 1.08;
    let x = move |v: f64| PAD + (W - PAD - 10.0) * v / xmax;
    let paths = series
        .into_iter()
        .map(|(pts, col)| {
            let d: String = pts
                .iter()
                .enumerate()
                .map(|(i, p)| format!("{}{:.1},{:.1} ", if i == 0 { "M" } else { "L" }, x(p.0), py(p.1, ymax)))
                .collect();
            let dots = pts
                .iter()
                .map(|p| view! { <circle cx=x(p.0) cy=py(p.1, ymax) r="2" fill=col /> })
                .collect_view();
            view! { <path d=d fill="none" stroke=col stroke-width="1.5" />{dots} }
        })
        .collect_view();
    let marks = marks
        .into_iter()
        .map(|s| view! { <line x1=x(s) x2=x(s) y1="16" y2=H - 24.0 stroke="#c0392b" stroke-dasharray="2,2" /> })
        .collect_view();
    view! {
        <svg id=id viewBox=format!("0 0 {W} {H}")>
            {axis(ymax, fmt)}
            {marks}
            {paths}
            <text x=W / 2.0 y=H - 4.0 font-size="11" text-anchor="middle">"step"</text>
        </svg>
    }
}

/// Loss and evaluation, step time and throughput, the loss scale and skipped steps,
/// the device, and kernel timings.
#[component]
fn TrainingView(lines: RwSignal<Vec<StepLog>>, run: RwSignal<RunView>) -> impl IntoView {
    let charts = move || {
        let l = lines.get();
        let s = steps(&l);
        let pt =
            |value: fn(&StepLog) -> Option<f64>| -> Vec<(f64, f64)> { s.iter().filter_map(|x| Some((x.step as f64, value(x)?))).collect() };
        let evals: Vec<(f64, f64)> = l.iter().filter_map(|x| Some((x.step as f64, x.eval.as_ref()?.loss))).collect();
        let skipped: Vec<f64> = s.iter().filter(|x| x.skipped == Some(true)).map(|x| x.step as f64).collect();
        let last = s.last().cloned().unwrap_or_default();
        let last_eval = l.iter().rev().find_map(|x| x.eval.clone());
        let scale = pt(|x| x.scale);
        let fmt_num: fn(f64) -> String = |v| format!("{v:.3}");
        let fmt_ms: fn(f64) -> String = |v| format!("{v:.0} ms");
        let fmt_scale: fn(f64) -> String = |v| format!("{v:.0}");
        view! {
            <div class="facts">
                <span>"loss " <b id="last-loss" data-loss=last.loss.map(|v| v.to_string()).unwrap_or_default()>{format!("{:.4}", last.loss.unwrap_or(0.0))}</b></span>
                {last_eval.map(|e| view! { <span>"eval loss " <b>{format!("{:.4}", e.loss)}</b>
                    {e.accuracy.map(|a| format!(" · accuracy {:.2}%", 100.0 * a))}</span> })}
                <span>"step " <b>{format!("{:.1} ms", last.step_ms.unwrap_or(0.0))}</b></span>
                <span>"throughput " <b>{format!("{:.0} samples/s", last.samples_per_s.unwrap_or(0.0))}</b></span>
                {last.scale.map(|v| view! { <span>"loss scale " <b>{format!("{v}")}</b>{format!(" · skipped steps {}", skipped.len())}</span> })}
            </div>
            <div class="legend"><span style="--c:#4e79a7">"train loss"</span><span style="--c:#e15759">"eval loss"</span></div>
            {line_chart("loss-chart", vec![(pt(|x| x.loss), "#4e79a7"), (evals, "#e15759")], fmt_num, skipped.clone())}
            <div class="legend"><span style="--c:#59a14f">"step time"</span></div>
            {line_chart("time-chart", vec![(pt(|x| x.step_ms), "#59a14f")], fmt_ms, Vec::new())}
            <div class="legend"><span style="--c:#f28e2b">"throughput (samples/s)"</span></div>
            {line_chart("throughput-chart", vec![(pt(|x| x.samples_per_s), "#f28e2b")], fmt_scale, Vec::new())}
            {(!scale.is_empty()).then(|| view! {
                <div class="legend"><span style="--c:#b07aa1">"loss scale (red: skipped steps)"</span></div>
                {line_chart("scale-chart", vec![(scale.clone(), "#b07aa1")], fmt_scale, skipped.clone())}
            })}
        }
    };
    let device = move || {
        let r = run.get();
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
        let bench = r.bench.clone().unwrap_or_default();
        view! {
            <table id="device-table">
                {rows.into_iter().map(|(k, v)| view! { <tr><th>{k}</th><td>{v}</td></tr> }).collect_view()}
            </table>
            <h2 style="margin-top:10px">"Kernel timings (wgtrain bench)"</h2>
            {kernels::bench_table(bench)}
        }
    };
    view! {
        <section id="training">
            <h2>"Training"</h2>
            {charts}
            <h2 style="margin-top:10px">"Device"</h2>
            {device}
        </section>
    }
}
