//! Screenshots of each dashboard view of a finished run, for the docs:
//! `cargo run --release --example dashboard_screenshots -- RUNS_DIR RUN OUT_DIR`
//! (RUNS_DIR holds RUN.jsonl and RUN.memory.json from `wgtrain train --log`; Debian's
//! chromium must be installed).

use std::path::PathBuf;
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions};
use wgtrain_web::{Dashboard, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [runs, run, out] = args.as_slice() else {
        return Err("usage: dashboard_screenshots RUNS_DIR RUN OUT_DIR".into());
    };
    let d = Dashboard::start(Options {
        addr: "127.0.0.1:0".parse()?,
        runs_dir: Some(PathBuf::from(runs)),
        ..Default::default()
    })?;
    let browser = Browser::new(
        LaunchOptions::default_builder()
            .path(Some(PathBuf::from(
                std::env::var("CHROME").unwrap_or_else(|_| "/usr/bin/chromium".into()),
            )))
            .sandbox(false)
            .window_size(Some((1400, 4000)))
            .build()?,
    )?;
    let tab = browser.new_tab()?;
    tab.set_default_timeout(Duration::from_secs(60));
    tab.navigate_to(&format!("{}?run={run}", d.url()))?;
    tab.wait_for_element("#memory-chart")?;
    tab.wait_for_element("#timeline-chart")?;
    std::fs::create_dir_all(out)?;
    for view in ["memory", "timeline", "allocator", "training"] {
        let png = tab
            .find_element(&format!("#{view}"))?
            .capture_screenshot(CaptureScreenshotFormatOption::Png)?;
        let path = PathBuf::from(out).join(format!("dashboard-{view}.png"));
        std::fs::write(&path, png)?;
        println!("{}", path.display());
    }
    Ok(())
}
