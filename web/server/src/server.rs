//! The HTTP side: the embedded app, the JSON API, live server-sent events, exports,
//! and the safety rules (a token on every request when one is set, run names checked
//! before any file is touched, 400 with a reason for bad parameters).
//!
//! Routes (all GET):
//! * `/`, `/pkg/app.js`, `/pkg/app_bg.wasm`, `/style.css`: the app (embedded; nothing
//!   is read from disk, so no path can leave the app's folder).
//! * `/api/health`: `{"ok": true, "dropped_frames": N}`.
//! * `/api/runs`: `[{"name", "live", "steps"}]`.
//! * `/api/runs/{name}`: the run's record without timelines, plus `timeline_steps`.
//! * `/api/runs/{name}/timeline?step=N`: one step's allocation timeline.
//! * `/api/runs/{name}/peak[?step=N]`: the blocks alive at the peak of the peak step among
//!   the kept timelines (or of step N), largest first, with the bytes by category.
//! * `/api/runs/{name}/whatif`: the estimated peak of the run's config under other
//!   memory policies (precision, checkpointing, micro-batch, optimizer-in-backward).
//! * `/api/runs/{name}/stream`: server-sent events, one JSON frame per step (live runs).
//! * `/api/runs/{name}/snapshot.json[?step=N]`, `/api/runs/{name}/snapshot.pickle[?step=N]`:
//!   memory_viz exports of one step (default: the peak step), named after it.
//! * `/api/runs/{name}/curves.csv`: every line of the log as a CSV row (the training
//!   curves, memory and evaluations), for spreadsheets and pandas.
//! * `/api/hparams`: the runs table, each run's flattened config and where it ended.
//!
//! May call: `recorder`, `viz`, `assets`, `wgtrain_record`. Called by: `lib`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use wgtrain_record::{BenchRecord, Health, RunEntry, RunView};

use crate::recorder::{Recorder, load_record, read_log, validate_log};
use crate::{assets, viz};
use wgtrain_record::RunRecord;
use wgtrain_record::{PageView, StepMemory, WhatIfView};

/// What the server serves.
pub struct Served {
    /// The run being trained now, if any.
    pub live: Option<Arc<Recorder>>,
    /// A folder of finished runs (`NAME.jsonl` with an optional `NAME.memory.json`).
    pub runs_dir: Option<PathBuf>,
    /// Required on every request when set (`?token=` or `Authorization: Bearer`).
    pub token: Option<String>,
    /// Kernel timings to show (a `wgtrain bench --json` file's records).
    pub bench: Option<Vec<BenchRecord>>,
    /// The host names (without port) a request's `Host` may carry (a tokenless loopback
    /// dashboard); any when None.
    pub allowed_hosts: Option<Vec<String>>,
}

type Shared = Arc<Served>;

/// An error answer with a reason.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({"error": self.1}))).into_response()
    }
}

fn bad(reason: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, reason.into())
}

/// Checks a run name: any text (spaces and accents included) without '/', '\\', control
/// characters or a leading '.', at most 128 bytes. Anything that could leave the runs
/// folder (a '/', "..", a NUL) is refused before touching a file.
pub fn valid_run_name(name: &str) -> Result<(), String> {
    let ok =
        !name.is_empty() && name.len() <= 128 && !name.starts_with('.') && !name.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "run name {name:?} is not allowed: no '/', '\\' or control characters, not starting with '.', at most 128 bytes"
        ))
    }
}

/// A file name for Content-Disposition: the run's name with anything outside printable
/// ASCII replaced.
fn download_name(name: &str, suffix: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_graphic() && c != '"' || c == ' ' { c } else { '_' })
        .collect();
    format!("attachment; filename=\"{safe}{suffix}\"")
}

enum Run {
    Live(Arc<Recorder>),
    /// A finished run's record (without its lines) and its log, which is streamed.
    Finished(Arc<RunRecord>, PathBuf),
}

impl Run {
    fn with<T>(&self, f: impl FnOnce(&RunRecord) -> T) -> T {
        match self {
            Run::Live(r) => r.with(f),
            Run::Finished(r, _) => f(r),
        }
    }
}

/// Whole-file passes (checking a log, parsing a record or every line) at once: two, so
/// that hundreds of requests for large files queue here instead of sharing the CPU with
/// the server's threads, and cheap requests (health, the list) stay fast meanwhile.
static FILE_PASSES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Runs blocking file work off the server's threads, at most [`FILE_PASSES`] at once.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, ApiError> {
    let _pass = FILE_PASSES
        .acquire()
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e))
}

async fn find_run(s: &Served, name: &str) -> Result<Run, ApiError> {
    valid_run_name(name).map_err(bad)?;
    if let Some(live) = &s.live
        && live.name() == name
    {
        return Ok(Run::Live(live.clone()));
    }
    let not_found = || ApiError(StatusCode::NOT_FOUND, format!("no run named {name:?}"));
    let dir = s.runs_dir.as_ref().ok_or_else(not_found)?;
    let log = dir.join(format!("{name}.jsonl"));
    // The log itself, not a link to a file elsewhere, nor a FIFO or a device.
    match std::fs::symlink_metadata(&log) {
        Err(_) => return Err(not_found()),
        Ok(_) => crate::recorder::plain_file(&log).map_err(|e| ApiError(StatusCode::FORBIDDEN, e))?,
    };
    let path = log.clone();
    let record = blocking(move || load_record(&path)).await?;
    Ok(Run::Finished(record, log))
}

fn list_runs(s: &Served) -> Vec<RunEntry> {
    let mut out = Vec::new();
    if let Some(live) = &s.live {
        let steps = live.with(|r| r.lines.iter().filter(|l| l.is_step()).count());
        out.push(RunEntry {
            name: live.name().to_string(),
            live: true,
            steps: Some(steps as u64),
        });
    }
    if let Some(dir) = &s.runs_dir
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            // Regular files only (a DirEntry's type does not follow symbolic links).
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".jsonl")).map(str::to_string))
            .filter(|n| valid_run_name(n).is_ok() && s.live.as_ref().is_none_or(|l| l.name() != n))
            .collect();
        names.sort();
        for n in names {
            out.push(RunEntry {
                name: n,
                live: false,
                steps: None,
            });
        }
    }
    out
}

async fn health(State(s): State<Shared>) -> impl IntoResponse {
    let dropped = s.live.as_ref().map_or(0, |l| l.dropped());
    axum::Json(Health {
        ok: true,
        dropped_frames: dropped,
    })
}

async fn runs(State(s): State<Shared>) -> impl IntoResponse {
    axum::Json(list_runs(&s))
}

async fn run(State(s): State<Shared>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let run = find_run(&s, &name).await?;
    if let Run::Finished(record, log) = run {
        return stream_finished(&s, name, record, log).await;
    }
    let live = true;
    // Copy under the lock, serialize outside it: the training thread takes the same lock.
    let (finished, info, lines, pages, steps) = run.with(|r| {
        (
            r.finished,
            r.info.clone(),
            r.lines.clone(),
            r.pages.clone(),
            r.timelines.keys().copied().collect::<Vec<_>>(),
        )
    });
    Ok(axum::Json(RunView {
        name,
        live,
        finished,
        info,
        lines,
        pages,
        timeline_steps: steps,
        bench: s.bench.clone(),
    })
    .into_response())
}

/// A finished run as `RunView` JSON, its lines streamed from the log in chunks: a large
/// log costs the server a chunk of memory, not the whole file, and a corrupt line is
/// found (422, naming it) before anything is sent.
async fn stream_finished(s: &Served, name: String, record: Arc<RunRecord>, log: PathBuf) -> Result<Response, ApiError> {
    let path = log.clone();
    blocking(move || validate_log(&path)).await?;
    let head = format!(
        "{{\"name\":{},\"live\":false,\"finished\":{},\"info\":{},\"pages\":{},\"timeline_steps\":{},\"bench\":{},\"lines\":[",
        to_json(&name),
        record.finished,
        to_json(&record.info),
        to_json(&record.pages),
        to_json(&record.timelines.keys().copied().collect::<Vec<_>>()),
        to_json(&s.bench),
    );
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    tokio::task::spawn_blocking(move || {
        const CHUNK: usize = 64 * 1024;
        let mut buf = head.into_bytes();
        let mut first = true;
        let sent = read_log(&log, |line| {
            if !std::mem::take(&mut first) {
                buf.push(b',');
            }
            buf.extend_from_slice(line.as_bytes());
            if buf.len() >= CHUNK {
                let chunk = bytes::Bytes::from(std::mem::take(&mut buf));
                tx.blocking_send(Ok(chunk)).map_err(|_| "the client left".to_string())?;
            }
            Ok(())
        });
        let last = match sent {
            Ok(()) => {
                buf.extend_from_slice(b"]}");
                Ok(bytes::Bytes::from(buf))
            }
            Err(e) => Err(std::io::Error::other(e)),
        };
        let _ = tx.blocking_send(last);
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// One part of a view as JSON text (the streamed body's head is written part by part).
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

fn parse_step(q: &HashMap<String, String>) -> Result<u64, ApiError> {
    let text = q
        .get("step")
        .ok_or_else(|| bad("missing the query parameter step (a step number)"))?;
    text.parse::<u64>()
        .map_err(|_| bad(format!("step must be a non-negative integer, got {text:?}")))
}

async fn timeline(
    State(s): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let step = parse_step(&q)?;
    let run = find_run(&s, &name).await?;
    let found = run.with(|r| {
        r.timelines
            .get(&step)
            .cloned()
            .ok_or_else(|| r.timelines.keys().copied().collect::<Vec<_>>())
    });
    match found {
        Ok(t) => Ok(axum::Json(t)),
        Err(kept) => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no timeline kept for step {step}; kept: {kept:?}"),
        )),
    }
}

async fn peak(
    State(s): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let run = find_run(&s, &name).await?;
    match chosen_timeline(&run, &q)? {
        (_, Some(t)) => Ok(axum::Json(t.peak())),
        (_, None) => Err(ApiError(StatusCode::NOT_FOUND, "the run has no step timelines yet".into())),
    }
}

async fn whatif(State(s): State<Shared>, Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    let run = find_run(&s, &name).await?;
    let info = run.with(|r| r.info.clone());
    let Some(info) = info else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            "the run has no record of its config (a log without NAME.memory.json)".into(),
        ));
    };
    Ok(axum::Json(WhatIfView {
        limit_bytes: info.cap.or(info.device.memory_bytes),
        options: info.whatif,
    }))
}

async fn stream(State(s): State<Shared>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let Run::Live(rec) = find_run(&s, &name).await? else {
        return Err(bad(format!("run {name:?} is finished: read /api/runs/{name} instead of a stream")));
    };
    // Lost frames are counted by the recorder as they are evicted (a client that reads
    // nothing is never polled); the client hears how many it lost when it reads again.
    let frames = BroadcastStream::new(rec.subscribe()).filter_map(move |item| match item {
        Ok(text) => Some(Ok::<Event, std::convert::Infallible>(Event::default().data(text.as_str()))),
        Err(BroadcastStreamRecvError::Lagged(n)) => Some(Ok(Event::default().event("dropped").data(n.to_string()))),
    });
    Ok(Sse::new(frames).keep_alive(KeepAlive::default()).into_response())
}

/// The step an export or a peak view is about: `?step=N`, else the kept timeline with
/// the largest peak (the log's peak step; the first of equals).
fn chosen_timeline(run: &Run, q: &HashMap<String, String>) -> Result<(Vec<PageView>, Option<StepMemory>), ApiError> {
    let wanted = match q.get("step") {
        Some(_) => Some(parse_step(q)?),
        None => None,
    };
    let (pages, step, kept) = run.with(|r| {
        let step = match wanted {
            Some(step) => r.timelines.get(&step).cloned(),
            None => r
                .timelines
                .values()
                .map(|t| (t, t.peak().peak_bytes))
                .fold(None, |best: Option<(&StepMemory, u64)>, (t, p)| match best {
                    Some((_, bp)) if bp >= p => best,
                    _ => Some((t, p)),
                })
                .map(|(t, _)| t.clone()),
        };
        (r.pages.clone(), step, r.timelines.keys().copied().collect::<Vec<_>>())
    });
    match (wanted, step) {
        (Some(w), None) => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no timeline kept for step {w}; kept: {kept:?}"),
        )),
        (_, step) => Ok((pages, step)),
    }
}

fn export_of(run: &Run, q: &HashMap<String, String>) -> Result<(viz::Snapshot, String), ApiError> {
    let (pages, step) = chosen_timeline(run, q)?;
    let suffix = step.as_ref().map_or(String::new(), |s| format!(".step{}", s.step));
    Ok((viz::snapshot(&pages, step.as_ref()), suffix))
}

async fn snapshot_json(
    State(s): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let run = find_run(&s, &name).await?;
    let (snap, suffix) = export_of(&run, &q)?;
    let mut resp = axum::Json(snap).into_response();
    resp.headers_mut().insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&download_name(&name, &format!("{suffix}.snapshot.json")))
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
    );
    Ok(resp)
}

/// A run's log lines: the live run's from memory, a finished run's parsed from its log.
async fn lines_of(run: &Run) -> Result<Vec<wgtrain_record::StepLog>, ApiError> {
    match run {
        Run::Live(r) => Ok(r.with(|r| r.lines.clone())),
        Run::Finished(_, log) => {
            let log = log.clone();
            blocking(move || {
                let mut lines = Vec::new();
                read_log(&log, |line| {
                    lines.push(serde_json::from_str(line).map_err(|e| e.to_string())?);
                    Ok(())
                })?;
                Ok(lines)
            })
            .await
        }
    }
}

/// The runs table: every run's config and where it ended (a run whose log cannot be
/// read is left out, and said in the server's log).
async fn hparams(State(s): State<Shared>) -> impl IntoResponse {
    let mut rows = Vec::new();
    for entry in list_runs(&s) {
        let row = async {
            let run = find_run(&s, &entry.name).await?;
            let lines = lines_of(&run).await?;
            let info = run.with(|r| r.info.clone());
            Ok::<_, ApiError>(wgtrain_record::HparamsRow::of(&entry.name, entry.live, info.as_ref(), &lines))
        };
        match row.await {
            Ok(r) => rows.push(r),
            Err(ApiError(_, e)) => tracing::warn!("runs table: {}: {e}", entry.name),
        }
    }
    axum::Json(rows)
}

async fn curves_csv(State(s): State<Shared>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let lines = lines_of(&find_run(&s, &name).await?).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
            (header::CONTENT_DISPOSITION, download_name(&name, ".curves.csv")),
        ],
        wgtrain_record::curves_csv(&lines),
    )
        .into_response())
}

async fn snapshot_pickle(
    State(s): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let run = find_run(&s, &name).await?;
    let (snap, suffix) = export_of(&run, &q)?;
    let bytes = viz::to_pickle(&snap).map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_DISPOSITION, download_name(&name, &format!("{suffix}.pickle"))),
        ],
        bytes,
    )
        .into_response())
}

fn asset(path: &str) -> Option<(&'static str, &'static [u8])> {
    Some(match path {
        "/" | "/index.html" => ("text/html; charset=utf-8", assets::INDEX_HTML.as_bytes()),
        "/style.css" => ("text/css; charset=utf-8", assets::STYLE_CSS.as_bytes()),
        "/pkg/app.js" => ("text/javascript; charset=utf-8", assets::APP_JS.as_bytes()),
        "/pkg/app_bg.wasm" => ("application/wasm", assets::APP_WASM),
        _ => return None,
    })
}

async fn static_file(req: Request) -> Response {
    match asset(req.uri().path()) {
        Some((mime, bytes)) => ([(header::CONTENT_TYPE, mime)], bytes).into_response(),
        None => ApiError(StatusCode::NOT_FOUND, format!("no file {}", req.uri().path())).into_response(),
    }
}

/// Constant-time comparison (the token must not leak through timing).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn check_host(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(allowed) = &s.allowed_hosts {
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        // The name without its port ("[::1]:8787" -> "[::1]", "localhost:9000" -> "localhost").
        let name = match host.rsplit_once(':') {
            Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        };
        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(name)) {
            return ApiError(
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "this dashboard answers only to {} (the request was for {host:?})",
                    allowed.join(", ")
                ),
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn check_token(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(token) = &s.token {
        let from_query = req
            .uri()
            .query()
            .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
            .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "token").map(|(_, v)| v));
        let from_header = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string);
        let given = from_query.or(from_header);
        if !given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
            return ApiError(
                StatusCode::UNAUTHORIZED,
                "this dashboard needs its token: open the address printed at start (with ?token=...)".into(),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// The router over `served`.
pub fn router(served: Served) -> Router {
    let shared = Arc::new(served);
    Router::new()
        .route("/api/health", get(health))
        .route("/api/runs", get(runs))
        .route("/api/runs/{name}", get(run))
        .route("/api/runs/{name}/timeline", get(timeline))
        .route("/api/runs/{name}/peak", get(peak))
        .route("/api/runs/{name}/whatif", get(whatif))
        .route("/api/runs/{name}/stream", get(stream))
        .route("/api/runs/{name}/snapshot.json", get(snapshot_json))
        .route("/api/runs/{name}/snapshot.pickle", get(snapshot_pickle))
        .route("/api/runs/{name}/curves.csv", get(curves_csv))
        .route("/api/hparams", get(hparams))
        .fallback(static_file)
        .layer(middleware::from_fn_with_state(shared.clone(), check_token))
        .layer(middleware::from_fn_with_state(shared.clone(), check_host))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(16 * 1024))
        .layer(tower_http::set_header::SetResponseHeaderLayer::overriding(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
        .with_state(shared)
}

/// Whether `addr` only listens on this machine.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}
