//! The dashboard's API over a real (short) training run: runs, records, timelines,
//! exports (JSON and memory_viz pickle), the live stream, bad parameters, run names
//! that try to leave the folder, the token rule, the bounded live queue, a bounded
//! denial of service on a real server process (idle connections, huge lines and
//! records, symlinks, FIFOs), and a share of the connections per client beyond loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use wgtrain_engine::train::observe::Observer;
use wgtrain_engine::train::{Config, RunOptions, Trainer};
use wgtrain_web::recorder::{QUEUE, Recorder, record_path};
use wgtrain_web::{Dashboard, Options};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgtrain-dash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// GET `path` over plain HTTP/1.1; returns (status, headers, body).
fn get(addr: SocketAddr, path: &str, auth: Option<&str>) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = auth.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (status, head, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 4 + n..];
    }
    out
}

/// A JSONL log's lines.
fn read_lines(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn json(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, _, body) = get(addr, path, None);
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Trains a few MLP steps with a recorder; returns the log path and the recorder.
fn short_run(dir: &std::path::Path, name: &str) -> (PathBuf, Arc<Recorder>) {
    let log = dir.join(format!("{name}.jsonl"));
    let config = Config::parse(
        "",
        &[
            "model.hidden=[32]".into(),
            "data.train_limit=256".into(),
            "data.eval_limit=64".into(),
            "train.batch_size=64".into(),
            "train.steps=5".into(),
        ],
    )
    .unwrap();
    let rec = Recorder::new(name, Some(record_path(&log)));
    let mut t = Trainer::new(config, None).unwrap();
    t.run(&RunOptions {
        log: Some(log.clone()),
        observer: Some(rec.clone()),
        ..Default::default()
    })
    .unwrap();
    (log, rec)
}

#[test]
fn api_serves_recorded_runs_and_refuses_bad_requests() {
    let dir = temp("api");
    let (log, _) = short_run(&dir, "mlp");
    assert!(record_path(&log).is_file(), "the record is saved beside the log");
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    assert!(d.token.is_none(), "loopback needs no token");
    let (status, runs) = json(d.addr, "/api/runs");
    assert_eq!(status, 200);
    assert_eq!(runs[0]["name"], "mlp");

    let (status, run) = json(d.addr, "/api/runs/mlp");
    assert_eq!(status, 200);
    let log_lines = read_lines(&log);
    assert_eq!(run["lines"].as_array().unwrap(), &log_lines, "the record shows the log's lines");
    assert_eq!(run["timeline_steps"], serde_json::json!([1, 2, 3, 4, 5]));
    assert_eq!(run["info"]["parameters"].as_u64(), Some((784 * 32 + 32 + 32 * 10 + 10) as u64));

    // A step's timeline: bands add up, at the peak instant, to the step's peak.
    let (status, t) = json(d.addr, "/api/runs/mlp/timeline?step=3");
    assert_eq!(status, 200);
    let bands = t["bands"].as_array().unwrap();
    assert!(bands.iter().any(|b| b["category"] == "activation"));
    let seq = |b: &Value, k: &str| b[k].as_u64().unwrap();
    let live_at = |e: u64| -> u64 {
        bands
            .iter()
            .filter(|b| seq(b, "start_seq") <= e && e < seq(b, "end_seq"))
            .map(|b| b["size"].as_u64().unwrap())
            .sum()
    };
    let most = (0..=t["events"].as_u64().unwrap()).map(live_at).max().unwrap();
    let peak = log_lines[2]["mem"]["peak"].as_u64().unwrap();
    assert_eq!(most, peak, "the timeline of step 3 peaks at the log's peak");

    // The peak: the log's peak step, its blocks largest first, adding up to the peak.
    let steps: Vec<&Value> = log_lines.iter().filter(|l| l.get("mem").is_some()).collect();
    let top = steps.iter().map(|l| l["mem"]["peak"].as_u64().unwrap()).max().unwrap();
    let top_step = steps.iter().find(|l| l["mem"]["peak"].as_u64() == Some(top)).unwrap()["step"].clone();
    let (status, p) = json(d.addr, "/api/runs/mlp/peak");
    assert_eq!(status, 200);
    assert_eq!((p["step"].clone(), p["peak_bytes"].as_u64()), (top_step.clone(), Some(top)), "{p}");
    let sizes: Vec<u64> = p["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["size"].as_u64().unwrap())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest first: {sizes:?}");
    assert_eq!(sizes.iter().sum::<u64>(), top);
    let by_cat: u64 = p["by_category"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(by_cat, top);
    // One source of truth: the peak panel's categories are the log's at the peak (the
    // allocator's), not another moment's with the same total.
    let top_line = steps.iter().find(|l| l["step"] == top_step).unwrap();
    for (cat, bytes) in top_line["mem"]["at_peak"].as_object().unwrap() {
        let shown = p["by_category"].get(cat).and_then(Value::as_u64).unwrap_or(0);
        assert_eq!(shown, bytes.as_u64().unwrap(), "{cat}: panel {shown}, log {bytes}");
    }
    assert!(p["blocks"][0]["label"].as_str().is_some_and(|l| !l.is_empty()));
    let (status, p3) = json(d.addr, "/api/runs/mlp/peak?step=3");
    assert_eq!((status, p3["peak_bytes"].as_u64()), (200, Some(peak)));
    assert_eq!(get(d.addr, "/api/runs/mlp/peak?step=x", None).0, 400);
    assert_eq!(get(d.addr, "/api/runs/mlp/peak?step=99", None).0, 404);

    // The runs table's row: the steps, the last loss and the config as run.
    let (status, table) = json(d.addr, "/api/hparams");
    assert_eq!(status, 200);
    let row = table
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "mlp")
        .expect("the run's row");
    let step_lines: Vec<&Value> = log_lines.iter().filter(|l| l.get("mem").is_some()).collect();
    assert_eq!(row["steps"].as_u64(), Some(step_lines.len() as u64));
    assert_eq!(row["loss"], step_lines.last().unwrap()["loss"]);
    assert_eq!(row["config"]["model.hidden"], "[32]", "{row}");

    // The curves as CSV: a row per log line, the log's values in their columns.
    let (status, head, body) = get(d.addr, "/api/runs/mlp/curves.csv", None);
    assert_eq!(status, 200);
    assert!(head.contains("text/csv") && head.contains("mlp.curves.csv"), "{head}");
    let csv = String::from_utf8(body).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    let col = |name: &str| rows[0].iter().position(|c| *c == name).unwrap();
    assert_eq!(rows.len(), log_lines.len() + 1, "a header and a row per line");
    for (row, line) in rows[1..].iter().zip(&log_lines) {
        assert_eq!(row[col("step")], line["step"].to_string());
        if let Some(loss) = line["loss"].as_f64() {
            assert_eq!(row[col("loss")].parse::<f64>().unwrap(), loss);
            assert_eq!(row[col("peak_bytes")], line["mem"]["peak"].to_string());
        }
        if let Some(eval) = line["eval"]["loss"].as_f64() {
            assert_eq!(row[col("eval_loss")].parse::<f64>().unwrap(), eval);
        }
    }
    assert!(log_lines.iter().any(|l| l.get("eval").is_some()), "the run evaluates");

    // Exports.
    let (status, head, body) = get(d.addr, "/api/runs/mlp/snapshot.json", None);
    assert_eq!(status, 200);
    assert!(head.contains("attachment"));
    let snap: Value = serde_json::from_slice(&body).unwrap();
    let pages = run["pages"].as_array().unwrap();
    assert_eq!(snap["segments"].as_array().unwrap().len(), pages.len());
    // memory_viz's replay: every traced block inside a segment, and the live bytes
    // replayed from the segments back through the trace peak at the log's peak.
    assert!(head.contains(&format!(".step{top_step}.snapshot.json")), "{head}");
    let segments = snap["segments"].as_array().unwrap();
    let trace = snap["device_traces"][0].as_array().unwrap();
    assert!(!trace.is_empty());
    let u = |v: &Value| v.as_u64().unwrap();
    for e in trace {
        let addr = u(&e["addr"]);
        assert!(
            segments
                .iter()
                .any(|s| u(&s["address"]) <= addr && addr + u(&e["size"]) <= u(&s["address"]) + u(&s["total_size"])),
            "{e} lies in no segment"
        );
    }
    let at_end: u64 = segments.iter().map(|s| u(&s["allocated_size"])).sum();
    let delta: i64 = trace
        .iter()
        .map(|e| {
            if e["action"] == "alloc" {
                u(&e["size"]) as i64
            } else {
                -(u(&e["size"]) as i64)
            }
        })
        .sum();
    let mut live = at_end as i64 - delta;
    let mut most = live;
    for e in trace {
        live += if e["action"] == "alloc" {
            u(&e["size"]) as i64
        } else {
            -(u(&e["size"]) as i64)
        };
        most = most.max(live);
    }
    assert_eq!(most as u64, top, "the export's replayed peak is the log's");
    // Phases and names: the peak's blocks say which phase made them; backward's
    // temporaries are named after the op they serve.
    let phases: Vec<&str> = p["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["phase"].as_str().unwrap())
        .collect();
    assert!(
        phases
            .iter()
            .all(|ph| ["forward", "backward", "optimizer", "readback", "before the step"].contains(ph)),
        "{phases:?}"
    );
    assert!(
        phases.contains(&"before the step") && phases.iter().any(|ph| *ph != "before the step"),
        "{phases:?}"
    );
    let backward: Vec<&str> = bands
        .iter()
        .filter(|b| b["phase"] == "backward")
        .map(|b| b["label"].as_str().unwrap())
        .collect();
    assert!(
        backward.iter().any(|l| l.starts_with("layers.") && l.ends_with(".weight.grad")),
        "{backward:?}"
    );
    assert!(!backward.iter().any(|l| ["dx", "weight.grad", "dy"].contains(l)), "{backward:?}");
    let spans = t["phases"].as_array().unwrap();
    let names: Vec<&str> = spans.iter().map(|s| s["phase"].as_str().unwrap()).collect();
    // The step reads nothing back before its update: the loss and the check's flag
    // come back once, at its end.
    assert_eq!(&names[..4], &["forward", "backward", "optimizer", "readback"][..], "{names:?}");
    // What-if: the run as configured (its estimate is the measured peak) and others.
    let (status, w) = json(d.addr, "/api/runs/mlp/whatif");
    assert_eq!(status, 200);
    let options = w["options"].as_array().unwrap();
    assert!(options.len() >= 3, "{w}");
    assert_eq!(
        (options[0]["change"].as_str(), u(&options[0]["peak_bytes"])),
        (Some(""), top),
        "{w}"
    );
    for o in options {
        assert!(
            o["policy"]["precision"].is_string() && o["fits"].is_boolean() && u(&o["peak_reserved_bytes"]) >= u(&o["peak_bytes"]),
            "{o}"
        );
    }
    assert!(options.iter().any(|o| o["policy"]["precision"] == "fp16-mixed"), "{w}");
    let (_, _, body) = get(d.addr, "/api/runs/mlp/snapshot.pickle?step=2", None);
    assert_eq!(status, 200);
    let pickled: serde_pickle::Value = serde_pickle::value_from_slice(&body, Default::default()).unwrap();
    let text = format!("{pickled:?}");
    for key in [
        "segments",
        "device_traces",
        "total_size",
        "blocks",
        "active_allocated",
        "free_completed",
        "time_us",
        "frames",
    ] {
        assert!(text.contains(key), "the pickle lacks {key}");
    }

    // Bad requests: reasons, not panics.
    for (path, code, words) in [
        ("/api/runs/mlp/timeline", 400, "missing the query parameter step"),
        ("/api/runs/mlp/timeline?step=-1", 400, "non-negative integer"),
        ("/api/runs/mlp/timeline?step=99", 404, "no timeline kept"),
        ("/api/runs/..%2F..%2Fetc%2Fpasswd", 400, "not allowed"),
        ("/api/runs/.hidden", 400, "not allowed"),
        ("/api/runs/nope", 404, "no run named"),
        ("/api/runs/mlp/stream", 400, "finished"),
        ("/../../etc/passwd", 404, "no file"),
        ("/pkg/../Cargo.toml", 404, "no file"),
    ] {
        let (status, _, body) = get(d.addr, path, None);
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, code, "{path}: {body}");
        assert!(body.contains(words), "{path}: {body}");
    }
    // The app itself is served.
    let (status, head, body) = get(d.addr, "/pkg/app_bg.wasm", None);
    assert_eq!(status, 200);
    assert!(head.contains("application/wasm") && body.starts_with(b"\0asm"));
    let (status, _, body) = get(d.addr, "/", None);
    assert!(status == 200 && String::from_utf8_lossy(&body).contains("/pkg/app.js"));

    // A corrupt log is a clear error, not a crash.
    std::fs::write(
        dir.join("broken.jsonl"),
        "{\"step\":1,\"loss\":2.5}\nnot json\n{\"step\":2,\"loss\":2.4}\n",
    )
    .unwrap();
    let (status, v) = json(d.addr, "/api/runs/broken");
    assert_eq!(status, 422);
    assert!(v["error"].as_str().unwrap().contains("line 2"), "{v}");
}

#[test]
fn non_loopback_addresses_require_the_token_on_every_request() {
    let rec = Recorder::new("live", None);
    let d = Dashboard::start(Options {
        addr: "0.0.0.0:0".parse().unwrap(),
        live: Some(rec),
        ..Default::default()
    })
    .unwrap();
    let token = d.token.clone().expect("a token is generated");
    assert_eq!(token.len(), 32);
    assert!(d.url().contains(&format!("token={token}")));
    let addr: SocketAddr = format!("127.0.0.1:{}", d.addr.port()).parse().unwrap();
    for path in ["/", "/pkg/app_bg.wasm", "/api/runs", "/api/health"] {
        assert_eq!(get(addr, path, None).0, 401, "{path} without a token");
        assert_eq!(get(addr, &format!("{path}?token=wrong"), None).0, 401, "{path} with a wrong token");
        assert_eq!(get(addr, &format!("{path}?token={token}"), None).0, 200, "{path} with the token");
        assert_eq!(get(addr, path, Some(&token)).0, 200, "{path} with a bearer token");
    }
}

/// GET `path` with `token` from the client address `from` (a loopback address of its
/// own: 127.0.0.2, ...); returns the status.
fn status_from(from: &str, addr: SocketAddr, path: &str, token: &str) -> u16 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        socket.connect(addr).await.unwrap()
    });
    let mut s = stream.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw).split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0)
}

#[test]
fn beyond_loopback_one_client_cannot_take_every_connection() {
    let d = Dashboard::start(Options {
        addr: "0.0.0.0:0".parse().unwrap(),
        live: Some(Recorder::new("live", None)),
        ..Default::default()
    })
    .unwrap();
    let token = d.token.clone().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", d.addr.port()).parse().unwrap();
    // One client (127.0.0.1) holds its share with connections that send nothing; one
    // more is closed at once, not after the first-byte deadline.
    let held: Vec<TcpStream> = (0..wgtrain_web::MAX_PER_CLIENT)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let start = std::time::Instant::now();
    let mut extra = TcpStream::connect(addr).unwrap();
    extra.set_read_timeout(Some(wgtrain_web::FIRST_BYTE_TIMEOUT * 2)).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(extra.read(&mut buf).unwrap_or(0), 0, "the connection past the share is closed");
    assert!(start.elapsed() < Duration::from_secs(2), "closed after {:?}", start.elapsed());
    // Another client is served meanwhile; once the first's connections end, so is it.
    assert_eq!(status_from("127.0.0.2", addr, "/api/health", &token), 200);
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(addr, "/api/health", Some(&token)).0, 200);
}

#[test]
fn on_loopback_half_open_connections_give_way_to_a_new_client() {
    let d = live_dashboard(&Recorder::new("live", None));
    let addr = d.addr;
    // A live stream, open before the others: busy, so never closed for them.
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET /api/runs/live/stream HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut head = [0u8; 64];
    assert!(stream.read(&mut head).unwrap() > 0);
    // More connections than the server serves at once, each with half its headers.
    let held: Vec<TcpStream> = (0..wgtrain_web::MAX_CONNECTIONS + 20)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET /api/runs HTTP/1.1\r\nX-Slow: 1\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // A client that sends its request at once is answered now, not once the header
    // deadline has closed the others.
    for _ in 0..3 {
        let start = std::time::Instant::now();
        assert_eq!(get(addr, "/api/health", None).0, 200);
        assert!(
            start.elapsed() < wgtrain_web::HEADER_TIMEOUT / 5,
            "answered after {:?}",
            start.elapsed()
        );
    }
    // The oldest half-open ones were closed for it; the newest still wait.
    let closed = |s: &TcpStream| {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        match (&*s).read(&mut buf) {
            Ok(0) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    };
    assert!(closed(&held[0]), "the oldest connection is still open");
    assert!(!closed(held.last().unwrap()), "the newest connection was closed");
    assert!(!closed(&stream), "the live stream was closed");
}

/// A loopback dashboard serving `rec` live.
fn live_dashboard(rec: &Arc<Recorder>) -> Dashboard {
    Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        live: Some(rec.clone()),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn live_stream_carries_each_step_and_slow_clients_lose_frames_not_training() {
    let dir = temp("live");
    let rec = Recorder::new("live", None);
    let d = live_dashboard(&rec);
    // A client that reads the stream while a run trains.
    let addr = d.addr;
    let reader = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(s, "GET /api/runs/live/stream HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut got = String::new();
        let mut buf = [0u8; 65536];
        while !got.contains("\"kind\":\"finished\"") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "stream closed early: {got}");
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        got
    });
    std::thread::sleep(Duration::from_millis(300));
    let log = dir.join("live.jsonl");
    let config = Config::parse(
        "",
        &[
            "model.hidden=[16]".into(),
            "data.train_limit=256".into(),
            "data.eval_limit=32".into(),
            "train.batch_size=64".into(),
            "train.steps=4".into(),
        ],
    )
    .unwrap();
    Trainer::new(config, None)
        .unwrap()
        .run(&RunOptions {
            log: Some(log),
            observer: Some(rec.clone()),
            ..Default::default()
        })
        .unwrap();
    let got = reader.join().unwrap();
    assert!(got.contains("text/event-stream"));
    for step in 1..=4 {
        assert!(got.contains(&format!("\"step\":{step},")), "step {step} missing from the stream");
    }
    assert!(got.contains("\"kind\":\"info\"") || got.contains("\"kind\":\"line\""));

    // The queue is bounded: a subscriber that never reads loses the oldest frames,
    // and publishing never waits for it.
    let mut slow = rec.subscribe();
    let line = wgtrain_engine::train::StepLog::default();
    let start = std::time::Instant::now();
    for _ in 0..QUEUE + 100 {
        rec.eval(&line).unwrap();
    }
    assert!(start.elapsed() < Duration::from_secs(2));
    match slow.try_recv() {
        Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => assert_eq!(n, 100),
        other => panic!("expected lost frames, got {other:?}"),
    }
}

/// GET with a chosen Host header; returns the status.
fn status_for_host(addr: SocketAddr, host: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /api/health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw).split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn empty_tokens_are_refused_and_loopback_checks_the_host() {
    // An empty token on an open address would let anyone in.
    for addr in ["0.0.0.0:0", "127.0.0.1:0"] {
        let started = Dashboard::start(Options {
            addr: addr.parse().unwrap(),
            token: Some(String::new()),
            ..Default::default()
        });
        assert!(matches!(started, Err(wgtrain_web::DashboardError::EmptyToken)), "{addr}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args([
            "dashboard",
            "--runs",
            std::env::temp_dir().to_str().unwrap(),
            "--addr",
            "0.0.0.0:0",
            "--token",
            "",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token is empty"));
    // DNS rebinding: a tokenless loopback dashboard answers only to loopback names.
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    })
    .unwrap();
    let port = d.addr.port();
    assert_eq!(status_for_host(d.addr, "attacker.example"), 421);
    assert_eq!(status_for_host(d.addr, &format!("attacker.example:{port}")), 421);
    assert_eq!(status_for_host(d.addr, &format!("127.0.0.1:{port}")), 200);
    assert_eq!(status_for_host(d.addr, &format!("localhost:{port}")), 200);
    assert_eq!(status_for_host(d.addr, "localhost:9000"), 200, "an SSH tunnel's port");
    assert_eq!(status_for_host(d.addr, "[::1]"), 200);
    assert_eq!(status_for_host(d.addr, "127.0.0.1.attacker.example"), 421);
}

#[test]
fn slow_clients_time_out_or_give_way_and_large_logs_stream() {
    let dir = temp("large");
    let (log, _) = short_run(&dir, "big");
    // Blow the log up to ~40 MB of real lines.
    let lines = std::fs::read_to_string(&log).unwrap();
    let mut big = String::with_capacity(41 << 20);
    while big.len() < 40 << 20 {
        big.push_str(&lines);
    }
    std::fs::write(&log, &big).unwrap();
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    // A client that never finishes its headers is dropped after the deadline.
    let mut slow = TcpStream::connect(d.addr).unwrap();
    write!(slow, "GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n", d.addr.port()).unwrap();
    slow.set_read_timeout(Some(wgtrain_web::HEADER_TIMEOUT + Duration::from_secs(10)))
        .unwrap();
    let start = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert!(
        start.elapsed() < wgtrain_web::HEADER_TIMEOUT + Duration::from_secs(5),
        "held for {:?}",
        start.elapsed()
    );
    assert!(
        n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // The large log is streamed: the server's memory grows by far less than the log,
    // and health answers while it is being sent.
    let hwm = || -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    let before = hwm();
    let addr = d.addr;
    let reader = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET /api/runs/big HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let (mut total, mut head, mut tail) = (0usize, Vec::new(), Vec::new());
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            if head.len() < 1 << 16 {
                head.extend_from_slice(&buf[..n]);
            }
            tail = buf[..n].to_vec();
            total += n;
            std::thread::sleep(Duration::from_millis(2)); // a slowish client
        }
        (
            total,
            String::from_utf8_lossy(&head).into_owned(),
            String::from_utf8_lossy(&tail).into_owned(),
        )
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = std::time::Instant::now();
    assert_eq!(json(d.addr, "/api/health").0, 200);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "health took {:?} during a large request",
        t.elapsed()
    );
    let (total, head, tail) = reader.join().unwrap();
    assert!(total > 40 << 20, "{total} bytes");
    assert!(head.contains("200 OK") && head.contains("\"lines\":["), "{head}");
    assert!(tail.trim_end().ends_with("]}") || tail.contains("]}"), "{tail}");
    let grown = hwm().saturating_sub(before);
    assert!(
        grown < 20 << 20,
        "the server's peak memory grew by {grown} bytes for a {} byte log",
        big.len()
    );
    // More clients than the server serves at once ask for the large log and never
    // read it: a new client is answered once their responses have waited
    // `STALLED`, not never.
    let stalled: Vec<TcpStream> = (0..wgtrain_web::MAX_CONNECTIONS + 10)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET /api/runs/big HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = std::time::Instant::now();
    assert_eq!(json(addr, "/api/health").0, 200);
    assert!(
        t.elapsed() < wgtrain_web::STALLED + Duration::from_secs(3),
        "health took {:?} behind clients that do not read",
        t.elapsed()
    );
    drop(stalled);
}

#[test]
fn dropped_frames_are_counted_as_they_are_lost() {
    let rec = Recorder::new("live", None);
    let d = live_dashboard(&rec);
    // A client that never reads: frames it misses are counted now, not when it reads.
    let _slow = rec.subscribe();
    let line = wgtrain_engine::train::StepLog::default();
    for _ in 0..QUEUE + 100 {
        rec.eval(&line).unwrap();
    }
    let (_, health) = json(d.addr, "/api/health");
    assert_eq!(health["dropped_frames"], 100, "{health}");
}

#[test]
fn names_with_spaces_and_accents_tokens_with_url_characters_and_relative_paths() {
    let dir = temp("names");
    let (log, _) = short_run(&dir, "plain");
    let named = dir.join("my run é.jsonl");
    std::fs::copy(&log, &named).unwrap();
    std::fs::copy(record_path(&log), record_path(&named)).unwrap();
    let token = "a&b+c%d é/?".to_string();
    let d = Dashboard::start(Options {
        addr: "0.0.0.0:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        token: Some(token.clone()),
        ..Default::default()
    })
    .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", d.addr.port()).parse().unwrap();
    let query = d.url().split_once('?').unwrap().1.to_string();
    let (status, _, body) = get(addr, &format!("/api/runs?{query}"), None);
    assert_eq!(status, 200, "the token works in the query, percent-encoded");
    let runs: Value = serde_json::from_slice(&body).unwrap();
    assert!(runs.as_array().unwrap().iter().any(|r| r["name"] == "my run é"), "{runs}");
    let (status, _, _) = get(addr, &format!("/api/runs/my%20run%20%C3%A9?{query}"), None);
    assert_eq!(status, 200);
    let (status, head, _) = get(addr, &format!("/api/runs/my%20run%20%C3%A9/snapshot.json?{query}"), None);
    assert_eq!(status, 200);
    assert!(head.contains("attachment"), "{head}");
    // A corrupt file: the error names it without the server's folders.
    std::fs::write(
        dir.join("broken.jsonl"),
        "{\"step\": 1, \"loss\": 2.5}\nnot json\n{\"step\": 3, \"loss\": 2.4}\n",
    )
    .unwrap();
    let (status, _, body) = get(addr, &format!("/api/runs/broken?{query}"), None);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("broken.jsonl line 2"), "{text}");
    assert!(!text.contains(dir.to_str().unwrap()), "an absolute path leaked: {text}");
}

/// Kills the child on drop (a failed assertion leaves no process behind).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_run_killed_mid_training_keeps_its_timelines() {
    use std::io::BufRead;
    let dir = temp("killed");
    let log = dir.join("killed.jsonl");
    let bin = env!("CARGO_BIN_EXE_wgtrain");
    let mut sets = vec!["train", "--quiet", "--log", log.to_str().unwrap()];
    for s in [
        "model.hidden=[32]",
        "data.train_limit=2560",
        "data.eval_limit=64",
        "train.batch_size=64",
        "train.steps=1000000",
        "train.eval_every=1000000",
    ] {
        sets.extend(["--set", s]);
    }
    let mut trainer = Child(std::process::Command::new(bin).args(&sets).spawn().unwrap());
    // Wait for steps and for a saved record holding some of them; then SIGKILL.
    let start = std::time::Instant::now();
    loop {
        assert!(start.elapsed() < Duration::from_secs(180), "no record saved while training");
        let lines = std::fs::read_to_string(&log).map(|t| t.lines().count()).unwrap_or(0);
        let kept = wgtrain_web::recorder::load_record(&log).map(|r| r.timelines.len()).unwrap_or(0);
        if lines >= 5 && kept >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    trainer.0.kill().unwrap();
    trainer.0.wait().unwrap();
    let logged = read_lines(&log);

    // `wgtrain dashboard --runs` over the folder shows the killed run's timelines.
    let mut dash = Child(
        std::process::Command::new(bin)
            .args(["dashboard", "--runs", dir.to_str().unwrap(), "--addr", "127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    std::io::BufReader::new(dash.0.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first.split_whitespace().nth(1).unwrap_or_else(|| panic!("{first}"));
    let addr: SocketAddr = url.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    let (status, run) = json(addr, "/api/runs/killed");
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["finished"], false, "a killed run never finished");
    assert!(run["info"]["parameters"].as_u64().is_some());
    let steps: Vec<u64> = run["timeline_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert!(steps.len() >= 3 && steps[..3] == [1, 2, 3], "{steps:?}");
    for step in steps {
        let (status, t) = json(addr, &format!("/api/runs/killed/timeline?step={step}"));
        assert_eq!(status, 200);
        let line = logged.iter().find(|l| l["step"] == step).expect("a kept step is in the log");
        let (_, p) = json(addr, &format!("/api/runs/killed/peak?step={step}"));
        assert!(!t["bands"].as_array().unwrap().is_empty());
        assert_eq!(p["peak_bytes"], line["mem"]["peak"], "step {step}");
    }
}

/// The resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A `wgtrain dashboard` process over `dir`; returns it and its address.
fn dashboard_process(dir: &std::path::Path) -> (std::process::Child, SocketAddr) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["dashboard", "--runs", dir.to_str().unwrap(), "--addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.split("http://").nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
    (child, addr)
}

/// Health answers within a second while the server is under load; returns how long.
fn health_within(addr: SocketAddr, limit: Duration) -> Duration {
    let t = std::time::Instant::now();
    assert_eq!(json(addr, "/api/health").0, 200);
    let took = t.elapsed();
    assert!(took < limit, "health took {took:?}");
    took
}

#[test]
fn a_bounded_denial_of_service_keeps_health_answering_and_memory_flat() {
    let dir = temp("dos");
    let (log, _) = short_run(&dir, "real");
    // A 300 MB one-line log, a 300 MB memory record, a symlink to a log elsewhere, and a
    // FIFO as a record.
    let huge = dir.join("oneline.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&huge).unwrap());
        f.write_all(b"{\"step\": 1, \"loss\": 1.0, \"pad\": \"").unwrap();
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..300 {
            f.write_all(&chunk).unwrap();
        }
        f.write_all(b"\"}\n").unwrap();
    }
    std::fs::copy(&log, dir.join("bigrecord.jsonl")).unwrap();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("bigrecord.memory.json")).unwrap());
        f.write_all(b"{\"pad\": \"").unwrap();
        let chunk = vec![b'y'; 1 << 20];
        for _ in 0..300 {
            f.write_all(&chunk).unwrap();
        }
        f.write_all(b"\"}").unwrap();
    }
    let elsewhere = temp("dos-elsewhere");
    std::fs::copy(&log, elsewhere.join("secret.jsonl")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("secret.jsonl"), dir.join("leak.jsonl")).unwrap();
    std::fs::copy(&log, dir.join("fifo.jsonl")).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(dir.join("fifo.memory.json"))
            .status()
            .unwrap()
            .success()
    );
    // Any JSON object is not a log line.
    std::fs::write(dir.join("notalog.jsonl"), "{\"hello\": 1}\n").unwrap();

    let (mut server, addr) = dashboard_process(&dir);
    let pid = server.id();
    health_within(addr, Duration::from_secs(1));
    let idle = rss(pid);
    // 200 connections that send nothing.
    let idle_conns: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(addr).unwrap()).collect();
    health_within(addr, Duration::from_secs(1));
    // Four clients hammer the large files while health is asked.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let path = [
                        "/api/runs/oneline",
                        "/api/runs/bigrecord",
                        "/api/runs/bigrecord/whatif",
                        "/api/runs/fifo",
                    ][i];
                    statuses.push(get(addr, path, None).0);
                }
                statuses
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    let mut peak = 0;
    for _ in 0..20 {
        worst = worst.max(health_within(addr, Duration::from_secs(1)));
        peak = peak.max(rss(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let statuses: Vec<Vec<u16>> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    for (i, s) in statuses.iter().enumerate() {
        assert!(!s.is_empty() && s.iter().all(|&c| c >= 400), "client {i} got {s:?}");
    }
    let grown = peak.saturating_sub(idle);
    eprintln!(
        "denial of service: 200 idle connections, 4 clients on 300 MB files: health within {worst:?}, memory +{} MB over idle {} MB",
        grown >> 20,
        idle >> 20
    );
    assert!(grown < 200 << 20, "the server grew by {grown} bytes");
    // Symlinked runs are neither listed nor served; non-log files are refused.
    let (_, runs) = json(addr, "/api/runs");
    let names: Vec<&str> = runs.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"real") && !names.contains(&"leak"), "{names:?}");
    assert_eq!(get(addr, "/api/runs/leak", None).0, 403);
    let (status, _, body) = get(addr, "/api/runs/notalog", None);
    assert!(
        status >= 400 && String::from_utf8_lossy(&body).contains("not a wgtrain log"),
        "{status}"
    );
    assert_eq!(json(addr, "/api/runs/real").0, 200);
    // Idle connections are closed after the first-byte deadline.
    let mut first = idle_conns.into_iter().next().unwrap();
    first
        .set_read_timeout(Some(wgtrain_web::FIRST_BYTE_TIMEOUT + Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(first.read(&mut buf).unwrap_or(0), 0, "an idle connection is closed");
    let _ = server.kill();
    let _ = server.wait();
    // The 600 MB of files it wrote go with it.
    let _ = std::fs::remove_dir_all(&dir);
}

/// CPU seconds a process has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[test]
fn running_out_of_file_descriptors_backs_off_and_recovers() {
    use std::io::BufRead;
    let dir = temp("nofile");
    short_run(&dir, "real");
    // 40 descriptors: the connections below take them all.
    let mut child = std::process::Command::new("prlimit")
        .args([
            "--nofile=40",
            env!("CARGO_BIN_EXE_wgtrain"),
            "dashboard",
            "--runs",
            dir.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr: SocketAddr = line.split("http://").nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
    let pid = child.id();
    assert_eq!(json(addr, "/api/health").0, 200);
    let before = cpu_seconds(pid);
    let conns: Vec<TcpStream> = (0..80).filter_map(|_| TcpStream::connect(addr).ok()).collect();
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_seconds(pid) - before;
    assert!(spent < 0.5, "the accept loop spun: {spent} s of CPU in 2 s");
    drop(conns);
    // Once the idle ones are closed (first-byte deadline), requests are served again.
    let start = std::time::Instant::now();
    loop {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = write!(s, "GET /api/health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        if String::from_utf8_lossy(&raw).contains("200 OK") {
            break;
        }
        assert!(start.elapsed() < wgtrain_web::FIRST_BYTE_TIMEOUT * 3, "the server did not recover");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let warnings = String::from_utf8_lossy(&out.stderr).matches("accept failed").count();
    assert!(warnings < 20, "{warnings} accept warnings");
}

/// A char GPT's peak has two moments with the same total (its categories differ):
/// the peak endpoint (what the peak panel shows) gives the log's make-up, the
/// allocator's, at every step.
#[test]
fn a_gpt_peaks_categories_are_the_logs() {
    let dir = std::env::temp_dir().join(format!("wgtrain-api-gpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("gpt.jsonl");
    let config = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/char_gpt.toml")).unwrap();
    let mut sets: Vec<String> = ["model.n_layer=2", "train.steps=4", "train.eval_every=1000"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    sets.push(format!("checkpoint.dir=\"{}\"", dir.join("ck").display()));
    Trainer::new(Config::parse(&config, &sets).unwrap(), None)
        .unwrap()
        .run(&RunOptions {
            log: Some(log.clone()),
            observer: Some(Recorder::new("gpt", Some(record_path(&log)))),
            ..Default::default()
        })
        .unwrap();
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    let lines: Vec<Value> = read_lines(&log).into_iter().filter(|v| v.get("mem").is_some()).collect();
    for line in &lines {
        let step = line["step"].as_u64().unwrap();
        let (status, p) = json(d.addr, &format!("/api/runs/gpt/peak?step={step}"));
        assert_eq!(status, 200, "{p}");
        for (cat, bytes) in line["mem"]["at_peak"].as_object().unwrap() {
            let shown = p["by_category"].get(cat).and_then(Value::as_u64).unwrap_or(0);
            assert_eq!(shown, bytes.as_u64().unwrap(), "step {step}, {cat}: panel {shown}, log {bytes}");
        }
    }
}
