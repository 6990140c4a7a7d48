//! What every view shares: the API's addresses and requests (the token passed on),
//! the run's state as signals (`Ctx`: the run, its lines, the chosen step and its
//! timeline, the runs to compare), and small helpers over step lines.
//!
//! May call: `wgtrain_record`, leptos, web-sys, gloo-net. Called by: the app and its views.

use leptos::prelude::*;
use wgtrain_record::{RunEntry, RunView, StepLog, StepMemory, format_bytes};

/// Bytes as the engine prints them (binary units), from a chart value.
pub fn bytes(n: f64) -> String {
    format_bytes(n.max(0.0).round() as u64)
}

fn search() -> String {
    web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default()
}

pub fn query_param(name: &str) -> Option<String> {
    web_sys::UrlSearchParams::new_with_str(&search()).ok().and_then(|p| p.get(name))
}

/// The token in this page's address, to pass on to the API.
pub fn token_query(first: bool) -> String {
    match query_param("token") {
        Some(t) => format!("{}token={}", if first { "?" } else { "&" }, encode(&t)),
        None => String::new(),
    }
}

/// Percent-encodes `s` for a URL path segment or query value: every byte of its UTF-8
/// outside the unreserved set (names with spaces or accents, tokens with '&' or '+').
pub fn encode(s: &str) -> String {
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

/// An API address for run `name`: `/api/runs/NAME{rest}` with the token.
pub fn api(name: &str, rest: &str) -> String {
    let sep = !rest.contains('?');
    format!("/api/runs/{}{rest}{}", encode(name), token_query(sep))
}

/// The server's error body.
#[derive(serde::Deserialize)]
struct ApiError {
    error: String,
}

pub async fn get_json<T: serde::de::DeserializeOwned>(url: &str) -> Result<T, String> {
    let resp = gloo_net::http::Request::get(url).send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(serde_json::from_str::<ApiError>(&text).map_or_else(|_| "request failed".to_string(), |e| e.error));
    }
    serde_json::from_str(&text).map_err(|e| format!("unexpected answer from {url}: {e}"))
}

/// Step lines (those with memory) of a run.
pub fn steps(lines: &[StepLog]) -> Vec<StepLog> {
    lines.iter().filter(|l| l.is_step()).cloned().collect()
}

/// The first step with the largest peak among `lines`.
pub fn peak_step(lines: &[StepLog]) -> Option<u64> {
    lines
        .iter()
        .filter_map(|l| Some((l.step, l.mem.as_ref()?.peak)))
        .fold(None, |best: Option<(u64, u64)>, (s, p)| match best {
            Some((_, bp)) if bp >= p => best,
            _ => Some((s, p)),
        })
        .map(|b| b.0)
}

/// The kept step nearest `step` (ties: the earlier).
fn nearest(kept: &[u64], step: u64) -> Option<u64> {
    kept.iter().copied().min_by_key(|s| (s.abs_diff(step), *s))
}

/// What every view reads: the run, its lines, the chosen step and its timeline.
#[derive(Clone, Copy)]
pub struct Ctx {
    /// The run shown.
    pub run_name: RwSignal<Option<String>>,
    /// Its view (facts, pages, timeline steps).
    pub run: RwSignal<RunView>,
    /// Its step and evaluation lines.
    pub lines: RwSignal<Vec<StepLog>>,
    /// Steps whose timeline can be fetched.
    pub timeline_steps: RwSignal<Vec<u64>>,
    /// The step the user chose (None: the peak step).
    pub chosen: RwSignal<Option<u64>>,
    /// The timeline shown (the chosen step's, or the nearest kept one).
    pub timeline: RwSignal<Option<StepMemory>>,
    /// Every run the server knows.
    pub runs: RwSignal<Vec<RunEntry>>,
    /// Runs overlaid on the training charts.
    pub compare: RwSignal<Vec<String>>,
}

impl Ctx {
    /// The step whose timeline is shown: the chosen one if kept, else the nearest kept
    /// one; by default the peak step.
    pub fn shown_step(&self) -> Option<u64> {
        let kept = self.timeline_steps.get();
        let want = self.chosen.get().or_else(|| peak_step(&self.lines.get()));
        match want {
            Some(w) if kept.contains(&w) => Some(w),
            Some(w) => nearest(&kept, w),
            None => kept.last().copied(),
        }
    }

    /// Opens `step` (a click in a chart, the step list).
    pub fn choose(&self, step: u64) {
        self.chosen.set(Some(step));
    }
}
