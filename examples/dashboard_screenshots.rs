//! Screenshots of every dashboard view of a finished run at 1400 and 800 px, for the
//! docs: `cargo run --release --example dashboard_screenshots -- RUNS_DIR RUN OUT_DIR
//! [COMPARED_RUN...] [--budget=SIZE]` (RUNS_DIR holds RUN.jsonl and RUN.memory.json
//! from `wgtrain train --log`, and the compared runs' logs; Debian's chromium must be
//! installed). Writes OUT_DIR/dashboard-VIEW-WIDTH.png for each view, and the whole
//! page; with a budget, typed into the what-if panel's "Will it fit in" first.

use std::path::PathBuf;
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions};
use wgtrain_web::{Dashboard, Options};

const VIEWS: [&str; 7] = ["memory", "peak-panel", "whatif", "timeline", "allocator", "training", "runs-table"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (budget, args): (Vec<String>, Vec<String>) = std::env::args().skip(1).partition(|a| a.starts_with("--budget="));
    let budget = budget.last().map(|b| b["--budget=".len()..].to_string());
    let [runs, run, out, compared @ ..] = args.as_slice() else {
        return Err("usage: dashboard_screenshots RUNS_DIR RUN OUT_DIR [COMPARED_RUN...] [--budget=SIZE]".into());
    };
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse()?,
        runs_dir: Some(PathBuf::from(runs)),
        ..Default::default()
    })?;
    std::fs::create_dir_all(out)?;
    for width in [1400u32, 800] {
        let browser = Browser::new(
            LaunchOptions::default_builder()
                .path(Some(PathBuf::from(
                    std::env::var("CHROME").unwrap_or_else(|_| "/usr/bin/chromium".into()),
                )))
                .sandbox(false)
                .window_size(Some((width, 5000)))
                .build()?,
        )?;
        let tab = browser.new_tab()?;
        tab.set_default_timeout(Duration::from_secs(60));
        let compare = if compared.is_empty() {
            String::new()
        } else {
            format!("&compare={}", compared.join(","))
        };
        tab.navigate_to(&format!("{}?run={run}{compare}", d.url()))?;
        tab.wait_for_element("#memory-chart")?;
        tab.wait_for_element("#timeline-chart")?;
        tab.wait_for_element("#peak-top")?;
        tab.wait_for_element("#whatif-table")?;
        if !compared.is_empty() {
            tab.wait_for_element("#config-diff")?;
        }
        if let Some(b) = &budget {
            tab.find_element("#whatif-budget")?.click()?;
            tab.type_str(b)?;
        }
        std::thread::sleep(Duration::from_millis(500));
        for view in VIEWS {
            let png = tab
                .find_element(&format!("#{view}"))?
                .capture_screenshot(CaptureScreenshotFormatOption::Png)?;
            let path = PathBuf::from(out).join(format!("dashboard-{view}-{width}.png"));
            std::fs::write(&path, png)?;
            println!("{}", path.display());
        }
        let png = tab.find_element("body")?.capture_screenshot(CaptureScreenshotFormatOption::Png)?;
        let path = PathBuf::from(out).join(format!("dashboard-page-{width}.png"));
        std::fs::write(&path, png)?;
        println!("{}", path.display());
    }
    Ok(())
}
