//! The dashboard in a real headless Chromium (Debian's `chromium`, which the README's
//! test command installs): the page opens before training starts, follows the run
//! live, and must show the run's real numbers (the peak equals the log's, the step
//! count, the last loss, the pages, a profiled step's kernel table); from a runs folder
//! it opens on the peak (the largest block's name without any interaction), shows the
//! what-if estimates, opens a step clicked in the memory chart, and compares two runs;
//! an MPI run (real `mpirun` ranks) names each rank and its machine.
//! Screenshots of each view are saved under
//! target/dashboard-screenshots (and WGTRAIN_SCREENSHOT_DIR when set, e.g. docs/).

use std::path::{Path, PathBuf};
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};
use serde_json::Value;
use wgtrain_engine::train::{Config, RunOptions, Trainer};
use wgtrain_web::recorder::{Recorder, record_path};
use wgtrain_web::{Dashboard, Options};

const STEPS: u64 = 40;

fn chromium() -> PathBuf {
    let candidates = [
        std::env::var("CHROME").ok(),
        Some("/usr/bin/chromium".into()),
        Some("/usr/bin/chromium-browser".into()),
    ];
    candidates
        .into_iter()
        .flatten()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("Chromium is needed: apt-get install chromium chromium-driver (./quickstart.sh test installs it)")
}

/// Headless Chromium with a 1400-pixel-wide window of `height` pixels.
fn launch(height: u32) -> Browser {
    Browser::new(
        LaunchOptions::default_builder()
            .path(Some(chromium()))
            .headless(true)
            .sandbox(false)
            .window_size(Some((1400, height)))
            .idle_browser_timeout(Duration::from_secs(300))
            .build()
            .unwrap(),
    )
    .expect("Chromium starts")
}

/// Saves the element `#view` as dashboard-VIEW.png under target/dashboard-screenshots
/// (and WGTRAIN_SCREENSHOT_DIR when set).
fn save_view(tab: &headless_chrome::Tab, view: &str) {
    let png = tab
        .find_element(&format!("#{view}"))
        .unwrap()
        .capture_screenshot(CaptureScreenshotFormatOption::Png)
        .unwrap();
    assert!(png.len() > 1000 && png.starts_with(b"\x89PNG"));
    let mut outs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots")];
    if let Ok(extra) = std::env::var("WGTRAIN_SCREENSHOT_DIR") {
        outs.push(PathBuf::from(extra));
    }
    for out in &outs {
        std::fs::create_dir_all(out).unwrap();
        std::fs::write(out.join(format!("dashboard-{view}.png")), &png).unwrap();
    }
}

/// `expr`'s value in the page in one DevTools round trip: headless_chrome's element
/// calls take four or five, each waiting up to 100 ms for its reader thread to let go
/// of the connection (0.5 s a lookup).
fn js(tab: &Tab, expr: &str) -> Value {
    tab.evaluate(expr, false).unwrap().value.unwrap_or(Value::Null)
}

/// `f(e)` of the first element matching `selector`; panics when none does.
fn on_element(tab: &Tab, selector: &str, f: &str) -> Value {
    let sel = serde_json::to_string(selector).unwrap();
    // As JSON text: the protocol hands objects (arrays too) back by reference.
    let expr = format!("(() => {{ const e = document.querySelector({sel}); return JSON.stringify(e ? [{f}] : null); }})()");
    match serde_json::from_str(js(tab, &expr).as_str().unwrap_or("null")).unwrap() {
        Value::Array(mut v) => v.pop().unwrap_or(Value::Null),
        _ => panic!("no element {selector}"),
    }
}

/// The attribute `name` of the element `selector` (which must have it).
fn attr(tab: &Tab, selector: &str, name: &str) -> String {
    attr_of(tab, selector, name).unwrap_or_else(|| panic!("{selector} has no {name}"))
}

/// The attribute `name` of the element `selector`, empty when it has none.
fn attr_or_empty(tab: &Tab, selector: &str, name: &str) -> String {
    attr_of(tab, selector, name).unwrap_or_default()
}

fn attr_of(tab: &Tab, selector: &str, name: &str) -> Option<String> {
    let name = serde_json::to_string(name).unwrap();
    on_element(tab, selector, &format!("e.getAttribute({name})"))
        .as_str()
        .map(str::to_string)
}

/// The element's `innerText`.
fn inner_text(tab: &Tab, selector: &str) -> String {
    on_element(tab, selector, "e.innerText").as_str().unwrap_or_default().to_string()
}

fn number(v: &str) -> f64 {
    v.trim().trim_matches('"').parse().unwrap_or_else(|_| panic!("not a number: {v:?}"))
}

#[test]
fn browser_follows_a_live_run_and_shows_its_real_numbers() {
    let dir = std::env::temp_dir().join(format!("wgtrain-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("browser.jsonl");
    let rec = Recorder::new("browser", Some(record_path(&log)));
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        live: Some(rec.clone()),
        bench: Some(
            serde_json::from_value(serde_json::json!([
                {"kernel": "matmul_f32", "dtype": "f32", "shape": [64, 64, 64], "median_us": 12.5, "gflops": 42.0, "gbps": null}
            ]))
            .unwrap(),
        ),
        ..Default::default()
    })
    .unwrap();

    let browser = launch(4000);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(180));
    // The page opens before the first step: what it shows comes over the live stream.
    tab.navigate_to(&d.url()).unwrap();
    tab.wait_until_navigated().unwrap();
    tab.wait_for_element("#memory").unwrap();

    let config = Config::parse(
        "",
        &[
            "model.hidden=[64]".into(),
            "data.train_limit=2560".into(),
            "data.eval_limit=200".into(),
            "train.batch_size=64".into(),
            format!("train.steps={STEPS}"),
            "train.eval_every=10".into(),
            "train.grad_clip=1.0".into(),
            "train.log_update_ratio=true".into(),
            "memory.cap=\"512MiB\"".into(),
        ],
    )
    .unwrap();
    let mut trainer = Trainer::new(config, None).unwrap();
    trainer
        .run(&RunOptions {
            log: Some(log.clone()),
            observer: Some(rec.clone()),
            profile_every: 10,
            ..Default::default()
        })
        .unwrap();

    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<&Value> = lines.iter().filter(|l| l.get("mem").is_some()).collect();
    assert_eq!(steps.len() as u64, STEPS);
    let peak = steps.iter().map(|l| l["mem"]["peak"].as_u64().unwrap()).max().unwrap();
    let last_loss = steps.last().unwrap()["loss"].as_f64().unwrap();

    // Memory per step: every step arrived live, and the peak shown is the log's.
    let chart = tab
        .wait_for_element(&format!("#memory-chart[data-steps=\"{STEPS}\"]"))
        .expect("the memory chart shows every step");
    let shown_peak = attr(&tab, "#peak-value", "data-peak-bytes");
    assert_eq!(number(&shown_peak), peak as f64, "peak shown vs the log's");
    let text = inner_text(&tab, "#peak-value");
    assert!(text.contains("peak") && text.contains("iB"), "{text}");
    let cap = attr(&tab, "#cap-value", "data-cap-bytes");
    assert_eq!(number(&cap), 512.0 * 1024.0 * 1024.0);
    // Hover shows a step's numbers.
    chart.move_mouse_over().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let tip = inner_text(&tab, "#memory-tip");
    assert!(tip.contains("step") && tip.contains("parameter"), "hover tip: {tip:?}");

    // Inside one step: a timeline with bands.
    let tl = tab.wait_for_element("#timeline-chart").unwrap();
    let bands = number(&tl.get_attribute_value("data-bands").unwrap().unwrap());
    assert!(bands > 3.0, "{bands} bands");
    // Under it, the same step's kernel table (steps 10, 20, 30, 40 were profiled), in
    // the log's order: where the time of the step went, beside where its memory went.
    tab.wait_for_element(&format!("#step-kernels-title[data-step=\"{STEPS}\"]"))
        .expect("the last step's kernel table");
    let logged = steps.last().unwrap()["kernels"]
        .as_array()
        .expect("the last step was profiled")
        .clone();
    let table = inner_text(&tab, "#step-kernels");
    let rows: Vec<&str> = table.lines().filter(|l| !l.trim().is_empty()).skip(1).collect();
    assert_eq!(rows.len(), logged.len().min(25), "{table}");
    assert!(rows[0].starts_with(logged[0]["name"].as_str().unwrap()), "{table}");

    // Allocator pages: those of the step shown (by default the peak step), at its peak.
    let shown_step = number(&tl.get_attribute_value("data-step").unwrap().unwrap()) as u64;
    let pages = rec.with(|r| r.timelines[&shown_step].pages.len());
    let shown_pages = inner_text(&tab, "#page-count");
    assert_eq!(number(&shown_pages) as usize, pages);

    // Training: the last loss is the log's; the device table names the adapter.
    let loss = attr(&tab, "#last-loss", "data-loss");
    assert_eq!(number(&loss), last_loss);
    let device = inner_text(&tab, "#device-table");
    assert!(device.contains(&trainer.rt.gpu.report.name), "{device}");
    let kernels = inner_text(&tab, "#kernel-table");
    assert!(kernels.contains("matmul_f32"), "{kernels}");
    for chart in ["#loss-chart", "#time-chart", "#throughput-chart"] {
        assert!(tab.find_element(chart).is_ok(), "{chart} missing");
    }
    // The gradient norm (clipping computes it) and the process's host memory, per step.
    for (chart, series) in [
        ("#grad-norm-chart", "gradient norm before clipping"),
        ("#host-memory-chart", "host memory of the process (MiB)"),
    ] {
        let path = tab
            .find_element(&format!("{chart} path[data-series=\"{series}\"]"))
            .unwrap_or_else(|_| panic!("{chart} has no {series} line"));
        let d = path.get_attribute_value("d").unwrap().unwrap_or_default();
        assert!(d.matches('L').count() + 1 >= STEPS as usize, "{chart}: one point a step: {d}");
    }
    // Evaluation's own peak, from the log's evaluation lines.
    let eval_peak = lines
        .iter()
        .filter_map(|l| l.pointer("/eval/peak").and_then(|p| p.as_u64()))
        .max()
        .expect("evaluation lines carry their peak");
    assert!(lines.iter().filter(|l| l.get("eval").is_some()).all(|l| {
        let (p, r) = (l["eval"]["peak"].as_u64().unwrap(), l["eval"]["reserved"].as_u64().unwrap());
        p > 0 && r >= p
    }));
    let shown = attr(&tab, "#eval-peak", "data-bytes");
    assert_eq!(number(&shown) as u64, eval_peak);
    // Each layer's update/weight ratio (log10), a line a layer, a point a step.
    for layer in ["layers.0", "layers.1"] {
        let d = tab
            .find_element(&format!("#update-ratio-chart path[data-series=\"{layer}\"]"))
            .unwrap_or_else(|_| panic!("no update ratio line for {layer}"))
            .get_attribute_value("d")
            .unwrap()
            .unwrap_or_default();
        assert_eq!(d.matches('L').count() + 1, STEPS as usize, "{layer}: {d}");
    }
    // GPU busy on every step: the profiled ones (every 10th) from their launches, the
    // others from the busy meter.
    let busy = lines.iter().filter(|l| l.get("gpu_ms").is_some()).count();
    assert_eq!(busy, STEPS as usize, "GPU busy on every step");
    let d = attr_or_empty(&tab, "#gpu-busy-chart path[data-series=\"GPU busy, % of the step\"]", "d");
    assert_eq!(d.matches('L').count() + 1, busy, "one point a step: {d}");

    // Screenshots of each view (of the live page, while its tab is in front).
    for view in ["memory", "peak-panel", "whatif", "timeline", "allocator", "training"] {
        save_view(&tab, view);
    }

    // A second run beside it in the folder, to compare with.
    let other_log = dir.join("other.jsonl");
    train_recorded(
        "other",
        &other_log,
        &[
            "model.hidden=[16]",
            "data.train_limit=1280",
            "data.eval_limit=200",
            "train.batch_size=64",
            "train.steps=20",
            "train.lr=3e-3",
        ],
    );

    // The same run, finished, from its files (`wgtrain dashboard --runs`).
    let finished = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    let tab2 = browser.new_tab().unwrap();
    tab2.set_default_timeout(Duration::from_secs(120));
    tab2.navigate_to(&format!("{}?run=browser", finished.url())).unwrap();
    tab2.wait_for_element(&format!("#memory-chart[data-steps=\"{STEPS}\"]")).unwrap();
    let again = attr(&tab2, "#peak-value", "data-peak-bytes");
    assert_eq!(number(&again), peak as f64);
    let status = inner_text(&tab2, "#status");
    assert!(status.contains("finished"), "{status}");
    tab2.wait_for_element("#timeline-chart").unwrap();

    // The peak, first, without any interaction: the peak step's largest block by name.
    let peak_step = steps.iter().find(|l| l["mem"]["peak"].as_u64() == Some(peak)).unwrap()["step"]
        .as_u64()
        .unwrap();
    let expected = rec.with(|r| r.timelines[&peak_step].peak());
    let top = tab2.wait_for_element("#peak-top").unwrap();
    assert_eq!(
        top.get_attribute_value("data-label").unwrap().as_deref(),
        Some(expected.blocks[0].label.as_str())
    );
    assert!(top.get_inner_text().unwrap().contains(&expected.blocks[0].label));
    let shown = attr(&tab2, "#peak-bytes", "data-bytes");
    assert_eq!(number(&shown), peak as f64);
    assert_eq!(number(&inner_text(&tab2, "#peak-step")), peak_step as f64);
    let rows = inner_text(&tab2, "#peak-blocks");
    assert!(rows.contains(&expected.blocks[1].label), "{rows}");
    assert!(rows.contains("backward") || rows.contains("forward"), "{rows}");
    // Searching the blocks: every block whose label holds the typed text, and no other.
    let query = "layers.1";
    let want: Vec<&str> = expected
        .blocks
        .iter()
        .map(|b| b.label.as_str())
        .filter(|l| l.contains(query))
        .collect();
    assert!(!want.is_empty() && want.len() < expected.blocks.len(), "{want:?}");
    tab2.find_element("#peak-search")
        .unwrap()
        .click()
        .unwrap()
        .type_into(query)
        .unwrap();
    let start = std::time::Instant::now();
    let shown = loop {
        let labels = js(
            &tab2,
            "JSON.stringify([...document.querySelectorAll('#peak-blocks tr.peak-block')].map(r => r.getAttribute('data-label') || ''))",
        );
        let shown: Vec<String> = serde_json::from_str(labels.as_str().unwrap()).unwrap();
        if shown.len() == want.len() || start.elapsed() > Duration::from_secs(10) {
            break shown;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(shown, want, "the rows matching '{query}'");

    // The curves' CSV export is linked from the training panel.
    let csv = attr(&tab2, "#curves-csv", "href");
    assert!(csv.contains("/api/runs/browser/curves.csv"), "{csv}");

    // What-if: the run as configured (its estimate is the log's peak) and other policies.
    tab2.wait_for_element("#whatif-table").unwrap();
    let whatif = rec.with(|r| r.info.clone().unwrap().whatif);
    assert!(whatif.len() >= 3);
    let first = tab2.find_element("#whatif-table tr[data-change=\"\"]").unwrap();
    assert_eq!(number(&first.get_attribute_value("data-peak").unwrap().unwrap()), peak as f64);
    let table = inner_text(&tab2, "#whatif-table");
    for w in &whatif[1..] {
        assert!(table.contains(&w.change), "{} missing from {table}", w.change);
    }
    // "Will it fit in ...?": a typed budget splits the options by their reserved peak:
    // just under the smallest, none fits; at the largest, all do.
    let reserved: Vec<u64> = whatif.iter().map(|w| w.peak_reserved_bytes).collect();
    let (least, most) = (*reserved.iter().min().unwrap(), *reserved.iter().max().unwrap());
    let input = tab2.find_element("#whatif-budget").unwrap();
    input.click().unwrap();
    tab2.type_str(&format!("{} B", least - 1)).unwrap();
    for budget in [least - 1, most] {
        if budget == most {
            input
                .call_js_fn(
                    &format!("function() {{ this.value = '{most}'; this.dispatchEvent(new Event('input', {{ bubbles: true }})); }}"),
                    vec![],
                    false,
                )
                .unwrap();
        }
        let wanted = if budget < least { "tr.nofit" } else { "tr:not(.nofit)" };
        tab2.wait_for_element(&format!("#whatif-table {wanted}")).unwrap();
        for w in &whatif {
            let row = format!("#whatif-table tr[data-change=\"{}\"]", w.change);
            let class = attr_or_empty(&tab2, &row, "class");
            let text = inner_text(&tab2, &row);
            let fits = w.peak_reserved_bytes <= budget;
            assert_eq!(class.contains("nofit"), !fits, "{budget}, {}: {text}", w.change);
            assert_eq!(text.contains("does not fit"), !fits, "{budget}, {}: {text}", w.change);
        }
    }
    tab2.type_str("x").unwrap();
    let said = inner_text(&tab2, "#whatif");
    assert!(said.contains("not a size"), "{said}");

    // A click in the memory chart opens that step: its timeline, its peak, the URL.
    let chart = tab2.find_element("#memory-chart").unwrap();
    let b = chart.get_box_model().unwrap();
    let (left, width) = (b.content.top_left.x, b.width);
    let (top_y, height) = (b.content.top_left.y, b.height);
    // The plot spans x 72..890 of the 900 units across, steps 1..STEPS.
    let target = STEPS;
    let x = left + width * 890.0 / 900.0 - 1.0;
    tab2.click_point(headless_chrome::browser::tab::point::Point {
        x,
        y: top_y + height * 0.5,
    })
    .unwrap();
    tab2.wait_for_element(&format!("#timeline-chart[data-step=\"{target}\"]"))
        .expect("the clicked step's timeline");
    let step_shown = inner_text(&tab2, "#peak-step");
    assert_eq!(number(&step_shown), target as f64);
    let at_target = rec.with(|r| r.timelines[&target].peak());
    assert_eq!(
        tab2.find_element("#peak-top")
            .unwrap()
            .get_attribute_value("data-label")
            .unwrap()
            .as_deref(),
        Some(at_target.blocks[0].label.as_str())
    );
    assert!(tab2.get_url().contains(&format!("step={target}")), "{}", tab2.get_url());

    // Run comparison: the other run's loss over this one's, and their config difference.
    tab2.find_element("#compare input[data-run=\"other\"]").unwrap().click().unwrap();
    tab2.wait_for_element("#loss-chart path[data-series=\"other train loss\"]")
        .expect("the compared run's loss");
    // And on every other curve it has.
    for (chart, series) in [
        ("#lr-chart", "other: learning rate"),
        ("#time-chart", "other: step time (ms)"),
        ("#throughput-chart", "other: throughput (samples/s)"),
    ] {
        tab2.find_element(&format!("{chart} path[data-series=\"{series}\"]"))
            .unwrap_or_else(|_| panic!("{chart} lacks {series}"));
    }
    let diff = tab2.wait_for_element("#config-diff").unwrap().get_inner_text().unwrap();
    assert!(
        diff.contains("train.lr") && diff.contains("model.hidden") && !diff.contains("train.batch_size"),
        "{diff}"
    );
    assert!(tab2.get_url().contains("compare=other"), "{}", tab2.get_url());

    // The runs table: both runs, where they ended, and the keys they differ in.
    tab2.wait_for_element("#hparams-table tr[data-run=\"other\"]").unwrap();
    let text = inner_text(&tab2, "#hparams-table");
    assert!(
        text.contains("train.lr") && text.contains("model.hidden") && !text.contains("train.batch_size"),
        "{text}"
    );
    let row = inner_text(&tab2, "#hparams-table tr[data-run=\"browser\"]");
    let last = steps.last().unwrap();
    assert!(row.contains(&STEPS.to_string()), "{row}");
    assert!(
        row.contains(&format!("{:.4}", last["loss"].as_f64().unwrap())),
        "{row} against {last}"
    );
}

/// Trains the default MLP with `sets` on top, logging to `log`, with the dashboard's
/// recorder (named `name`) writing its record beside the log.
fn train_recorded(name: &str, log: &Path, sets: &[&str]) {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Trainer::new(Config::parse("", &sets).unwrap(), None)
        .unwrap()
        .run(&RunOptions {
            log: Some(log.to_path_buf()),
            observer: Some(Recorder::new(name, Some(record_path(log)))),
            ..Default::default()
        })
        .unwrap();
}

#[test]
fn a_multi_device_run_shows_each_devices_memory_and_the_hosts() {
    let dir = std::env::temp_dir().join(format!("wgtrain-browser-devices-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("two.jsonl");
    train_recorded(
        "two",
        &log,
        &[
            "data.train_limit=384",
            "data.eval_limit=100",
            "train.batch_size=64",
            "train.steps=6",
            "model.hidden=[32]",
            "parallel.devices=[\"0\",\"0\"]",
            "parallel.zero=2",
            "parallel.offload=\"optimizer\"",
        ],
    );
    // Each device's largest peak over the run, from the log.
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v.get("mem").is_some())
        .collect();
    let want: Vec<u64> = (0..2)
        .map(|d| {
            lines
                .iter()
                .map(|v| v["mem"]["devices"][d]["peak"].as_u64().unwrap())
                .max()
                .unwrap()
        })
        .collect();
    let host = lines.last().unwrap()["mem"]["host"]["optimizer_state"].as_u64().unwrap();
    assert!(host > 0);

    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    let browser = launch(3000);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(120));
    tab.navigate_to(&format!("{}?run=two", d.url())).unwrap();
    tab.wait_for_element("#devices-chart[data-devices=\"2\"]").unwrap();
    let rows = tab.find_elements("#devices-table .device-row").unwrap();
    assert_eq!(rows.len(), 2, "one row per device");
    for (d, row) in rows.iter().enumerate() {
        let peak = number(&row.get_attribute_value("data-peak-bytes").unwrap().unwrap());
        assert_eq!(peak as u64, want[d], "device {d}'s peak against the log");
    }
    let shown = tab.find_element("#host-memory").unwrap();
    assert_eq!(number(&shown.get_attribute_value("data-host-bytes").unwrap().unwrap()) as u64, host);
    save_view(&tab, "devices");
}

#[test]
fn an_mpi_run_names_each_rank_and_its_machine() {
    let dir = std::env::temp_dir().join(format!("wgtrain-browser-mpi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("ranks.jsonl");
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args(["-n", "2", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .arg(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["train", "--quiet", "--log"])
        .arg(&log);
    for set in [
        "data.train_limit=256",
        "data.eval_limit=64",
        "train.batch_size=64",
        "train.steps=3",
        "model.hidden=[32]",
        "parallel.backend=\"mpi\"",
        "parallel.zero=1",
    ] {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("mpirun runs (the quick start installs openmpi-bin)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The machine each rank's line names, from the log.
    let text = std::fs::read_to_string(&log).unwrap();
    let last: Value = serde_json::from_str(text.lines().rev().find(|l| l.contains("\"mem\"")).unwrap()).unwrap();
    let nodes: Vec<String> = (0..2)
        .map(|r| last["mem"]["devices"][r]["node"].as_str().unwrap().to_string())
        .collect();

    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    let browser = launch(3000);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(120));
    tab.navigate_to(&format!("{}?run=ranks", d.url())).unwrap();
    tab.wait_for_element("#devices-chart[data-devices=\"2\"]").unwrap();
    let heading = inner_text(&tab, "#devices h2");
    assert!(heading.contains("2 MPI ranks"), "{heading}");
    let names: Vec<String> = tab
        .find_elements("#devices-table .device-row .device-name")
        .unwrap()
        .iter()
        .map(|e| e.get_inner_text().unwrap().trim().to_string())
        .collect();
    assert_eq!(names, [format!("rank 0 on {}", nodes[0]), format!("rank 1 on {}", nodes[1])]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_runs_folder_says_so_in_every_panel() {
    let dir = std::env::temp_dir().join(format!("wgtrain-browser-empty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        runs_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    let browser = launch(2000);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(120));
    tab.navigate_to(&d.url()).unwrap();
    let whatif = tab.wait_for_element("#whatif p.empty").unwrap();
    // Not "estimating..." forever: there is nothing to estimate.
    let said = whatif.get_inner_text().unwrap();
    assert_eq!(said, "no run selected");
}
