//! The dashboard app (Leptos, client-side rendered): reads a run from the server's API,
//! follows a live run over server-sent events (and a run still being written to a
//! runs folder by polling), and draws its views as SVG: memory per step (click a step
//! to open it), what filled memory at the chosen step's peak (`peak`), what other
//! memory policies would need (`peak`), the step's allocation timeline with its phases
//! and the allocator's pages at the peak (`timeline`), and training curves with run
//! comparison (`training`); a profiled step's kernel table sits under its timeline
//! (`kernels`). The URL keeps the run, the chosen step and the compared runs. The data
//! it reads are the record crate's types (`wgtrain_record`), the same the trainer and the
//! server write.
//!
//! May call: `kernels`, `memory`, `peak`, `state`, `timeline`, `training`,
//! `wgtrain_record`, leptos, web-sys. Called by: the browser.

mod charts;
mod devices;
mod kernels;
mod memory;
mod peak;
mod runs_table;
mod state;
mod timeline;
mod training;

use leptos::prelude::*;
use state::{Ctx, api, get_json, query_param, steps, token_query};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wgtrain_record::{Frame, RunEntry, RunView, StepMemory};

#[wasm_bindgen(start)]
pub fn start() {
    leptos::mount::mount_to_body(App);
}

/// Keeps the run, the chosen step and the compared runs in the address bar.
fn keep_in_url(ctx: Ctx) {
    Effect::new(move |_| {
        let Ok(params) = web_sys::UrlSearchParams::new() else { return };
        if let Some(t) = query_param("token") {
            params.append("token", &t);
        }
        if let Some(n) = ctx.run_name.get() {
            params.append("run", &n);
        }
        if let Some(s) = ctx.chosen.get() {
            params.append("step", &s.to_string());
        }
        let compare = ctx.compare.get();
        if !compare.is_empty() {
            params.append("compare", &compare.join(","));
        }
        let url = format!("?{}", String::from(params.to_string()));
        if let Some(h) = web_sys::window().and_then(|w| w.history().ok()) {
            let _ = h.replace_state_with_url(&JsValue::NULL, "", Some(&url));
        }
    });
}

/// Loads run `name` into the context; follows it live, or polls it while a runs
/// folder's log is still being written.
fn load_run(ctx: Ctx, name: String, live: RwSignal<bool>, dropped: RwSignal<u64>, error: RwSignal<Option<String>>) {
    leptos::task::spawn_local(async move {
        match get_json::<RunView>(&api(&name, "")).await {
            Ok(v) => {
                error.set(None);
                if ctx.run_name.get_untracked().as_deref() != Some(name.as_str()) {
                    return;
                }
                let is_live = v.live && !v.finished;
                let polling = !v.live && !v.finished;
                if ctx.lines.get_untracked() != v.lines {
                    ctx.lines.set(v.lines.clone());
                }
                if ctx.timeline_steps.get_untracked() != v.timeline_steps {
                    ctx.timeline_steps.set(v.timeline_steps.clone());
                }
                live.set(is_live);
                ctx.run.set(v);
                if is_live {
                    follow(&name, ctx, live, dropped);
                } else if polling {
                    // A run another process is still writing (or one that was killed):
                    // read it again in a while.
                    set_timeout(
                        move || {
                            if ctx.run_name.get_untracked().as_deref() == Some(name.as_str()) {
                                load_run(ctx, name, live, dropped, error);
                            }
                        },
                        std::time::Duration::from_secs(5),
                    );
                }
            }
            Err(e) => error.set(Some(e)),
        }
    });
}

#[component]
fn App() -> impl IntoView {
    let ctx = Ctx {
        run_name: RwSignal::new(None),
        run: RwSignal::new(RunView::default()),
        lines: RwSignal::new(Vec::new()),
        timeline_steps: RwSignal::new(Vec::new()),
        chosen: RwSignal::new(query_param("step").and_then(|s| s.parse().ok())),
        timeline: RwSignal::new(None),
        runs: RwSignal::new(Vec::new()),
        compare: RwSignal::new(
            query_param("compare")
                .map(|c| c.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect())
                .unwrap_or_default(),
        ),
    };
    let live = RwSignal::new(false);
    let dropped = RwSignal::new(0u64);
    let error = RwSignal::new(None::<String>);
    let empty = RwSignal::new(false);

    // Which run: ?run=NAME, else the live one, else the first (the address is read
    // now: keeping the state in it rewrites it).
    let asked = query_param("run");
    leptos::task::spawn_local(async move {
        match get_json::<Vec<RunEntry>>(&format!("/api/runs{}", token_query(true))).await {
            Ok(list) => {
                let wanted = asked.or_else(|| list.iter().find(|r| r.live).or(list.first()).map(|r| r.name.clone()));
                ctx.runs.set(list);
                match wanted {
                    Some(n) => ctx.run_name.set(Some(n)),
                    None => empty.set(true),
                }
            }
            Err(e) => error.set(Some(e)),
        }
    });
    Effect::new(move |_| {
        if let Some(name) = ctx.run_name.get() {
            load_run(ctx, name, live, dropped, error);
        }
    });
    // The shown step's timeline, one fetch at a time.
    let inflight = RwSignal::new(None::<(String, u64)>);
    Effect::new(move |_| {
        let (Some(name), Some(step)) = (ctx.run_name.get(), ctx.shown_step()) else {
            return;
        };
        let have = ctx.timeline.with_untracked(|t| t.as_ref().map(|t| t.step));
        if have == Some(step) || inflight.get_untracked() == Some((name.clone(), step)) {
            return;
        }
        inflight.set(Some((name.clone(), step)));
        leptos::task::spawn_local(async move {
            match get_json::<StepMemory>(&api(&name, &format!("/timeline?step={step}"))).await {
                Ok(v) if ctx.run_name.get_untracked().as_deref() == Some(name.as_str()) => ctx.timeline.set(Some(v)),
                Ok(_) => {}
                // A live run keeps the latest timelines only: this one was dropped.
                Err(_) => ctx.timeline_steps.update(|t| t.retain(|s| *s != step)),
            }
            inflight.set(None);
        });
    });
    keep_in_url(ctx);

    let status = move || {
        let n = steps(&ctx.lines.get()).len();
        let run = ctx.run.get();
        let state = if live.get() {
            "live"
        } else if run.finished {
            "finished"
        } else {
            "not finished (still being written, or stopped)"
        };
        format!("{n} steps · {state} · dropped frames {}", dropped.get())
    };
    let select_run = move |ev: web_sys::Event| {
        if let Some(sel) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlSelectElement>().ok()) {
            ctx.timeline.set(None);
            ctx.chosen.set(None);
            ctx.compare.update(|c| c.retain(|n| *n != sel.value()));
            ctx.run_name.set(Some(sel.value()));
        }
    };
    view! {
        <header>
            <h1>"wgtrain"</h1>
            <select id="run-select" on:change=select_run>
                {move || ctx.runs.get().into_iter().map(|r| {
                    let n = r.name;
                    let selected = ctx.run_name.get().as_deref() == Some(n.as_str());
                    view! { <option value=n.clone() selected=selected>{n.clone()}</option> }
                }).collect_view()}
            </select>
            <span class="status" id="status">{status}</span>
        </header>
        {move || error.get().map(|e| view! { <div class="error" id="error">{e}</div> })}
        {move || empty.get().then(|| view! {
            <div class="empty-state" id="empty-state">
                <h2>"No runs yet"</h2>
                <p>"Start one with the dashboard on: " <code>"wgtrain train examples/configs/fashion_mlp.toml --log runs/fashion_mlp.jsonl --dashboard"</code></p>
                <p>"or show a folder of logs written with --log: " <code>"wgtrain dashboard --runs runs"</code></p>
            </div>
        })}
        <main>
            <memory::MemoryView ctx=ctx />
            <devices::DevicesView ctx=ctx />
            <peak::PeakPanel ctx=ctx />
            <peak::WhatIfPanel ctx=ctx />
            <timeline::TimelineView ctx=ctx />
            <timeline::AllocatorView ctx=ctx />
            <training::TrainingView ctx=ctx />
            <runs_table::RunsTable ctx=ctx />
        </main>
    }
}

/// Subscribes to the live stream of `name`.
fn follow(name: &str, ctx: Ctx, live: RwSignal<bool>, dropped: RwSignal<u64>) {
    let Ok(source) = web_sys::EventSource::new(&api(name, "/stream")) else {
        return;
    };
    let known = ctx.lines.get_untracked().len();
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
        let Some(text) = ev.data().as_string() else { return };
        let Ok(frame) = serde_json::from_str::<Frame>(&text) else { return };
        match frame {
            Frame::Line { line, timeline, pages } => {
                if let Some(pages) = pages {
                    ctx.run.update(|r| r.pages = pages);
                }
                let step = line.step;
                ctx.lines.update(|l| {
                    // Frames sent before the first read are already in it.
                    if l.len() >= known && !l.contains(&line) {
                        l.push(line)
                    }
                });
                if timeline {
                    ctx.timeline_steps.update(|t| {
                        if !t.contains(&step) {
                            t.push(step)
                        }
                    });
                }
            }
            Frame::Info { info } => ctx.run.update(|r| r.info = Some(info)),
            Frame::Finished => {
                live.set(false);
                ctx.run.update(|r| r.finished = true);
            }
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
