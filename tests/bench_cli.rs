//! `wgtrain bench`: the GPT-2 step's rows and ResNet-50's convolutions (here at the tiny
//! `--quick` shapes) check out against their references and carry a median with its
//! spread over enough repeats, flagged exactly when the spread passes 10%; `--compare` prints each matching row's
//! ratio against a previous file, and a file that is not one is a clear error before
//! anything is measured.

mod cli;

use cli::{run_ok, scratch, wgtrain};

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn gpt2_rows_are_checked_timed_with_their_spread_and_comparable() {
    let dir = scratch("bench");
    let first = dir.join("first.json");
    let table = run_ok(
        &args(&["bench", "--quick", "--filter", "gpt2.attn_proj", "--json", first.to_str().unwrap()]),
        &[],
    );
    assert!(table.contains("spread"), "{table}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&first).unwrap()).unwrap();
    let names: std::collections::BTreeSet<&str> = rows.iter().map(|r| r["kernel"].as_str().unwrap()).collect();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["gpt2.attn_proj.dw", "gpt2.attn_proj.dx", "gpt2.attn_proj.fwd"]
    );
    for r in &rows {
        assert_eq!(r["ok"], true, "{r}");
        assert!(r["repeats"].as_u64().unwrap() >= 15, "{r}");
        let spread = r["spread"].as_f64().unwrap();
        assert!(spread >= 0.0 && spread.is_finite(), "{r}");
        assert_eq!(r.get("flag").is_some(), spread > 0.10, "flagged exactly when spread: {r}");
        assert!(r["gflops"].as_f64().unwrap() > 0.0);
    }
    // The same rows again, against the first run: every row matched, with a ratio.
    let again = run_ok(
        &args(&[
            "bench",
            "--quick",
            "--filter",
            "gpt2.attn_proj.fwd",
            "--compare",
            first.to_str().unwrap(),
        ]),
        &[],
    );
    let matched = rows.iter().filter(|r| r["kernel"] == "gpt2.attn_proj.fwd").count();
    assert!(again.contains(&format!("{matched} rows matched")), "{again}");
    let line = again
        .lines()
        .rev()
        .find(|l| l.starts_with("gpt2.attn_proj.fwd"))
        .expect("a comparison line");
    let ratio: f64 = line.split_whitespace().nth(6).unwrap().parse().unwrap();
    assert!(ratio > 0.0 && ratio.is_finite(), "{line}");
}

#[test]
fn a_compare_file_that_is_not_bench_rows_is_a_clear_error() {
    let dir = scratch("bench-bad");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"kernel\": 3}").unwrap();
    let out = wgtrain(&["bench", "--quick", "--compare", bad.to_str().unwrap()], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a list of benchmark rows"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).is_empty(), "nothing measured");
    let missing = wgtrain(&["bench", "--quick", "--compare", dir.join("none.json").to_str().unwrap()], &[]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

/// `--matmul MxKxN` times the user's shapes; `--launches N` times N calls back to back
/// and reports one's time (the row says how many); `--splits N` forces K slices, and a
/// shape that cannot take them is left out with the reason; a malformed shape is a clear
/// usage error before anything runs.
#[test]
fn user_shapes_back_to_back_launches_and_forced_slices() {
    let dir = scratch("bench-shapes");
    let out = dir.join("rows.json");
    let table = run_ok(
        &args(&[
            "bench",
            "--quick",
            "--matmul",
            "64x512x96",
            "--matmul",
            "32x48x16",
            "--launches",
            "3",
            "--splits",
            "2",
            "--json",
            out.to_str().unwrap(),
        ]),
        &[],
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let shapes: Vec<&serde_json::Value> = rows.iter().map(|r| &r["shape"]).collect();
    assert_eq!(
        shapes,
        [&serde_json::json!([64, 512, 96]), &serde_json::json!([32, 48, 16])],
        "{table}"
    );
    for r in &rows {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["extra"], serde_json::json!({"launches": 3, "splits": 2}), "{r}");
    }
    // 7 equal slices of 512 do not exist (here the tiled kernel runs, which takes only
    // equal ones): the row is left out and the run still succeeds.
    let odd = wgtrain(&["bench", "--quick", "--matmul", "64x512x96", "--splits", "7"], &[]);
    assert!(odd.status.success());
    let err = String::from_utf8_lossy(&odd.stderr);
    assert!(err.contains("row left out: 7 slices of K = 512"), "{err}");
    assert!(!String::from_utf8_lossy(&odd.stdout).contains("[64, 512, 96]"));
    let bad = wgtrain(&["bench", "--quick", "--matmul", "64x512"], &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not MxKxN"));
}

#[test]
fn resnet_convolution_rows_check_out_and_filters_combine() {
    let dir = scratch("bench-resnet");
    let out = dir.join("rows.json");
    run_ok(
        &args(&[
            "bench",
            "--quick",
            "--filter",
            // Two filters, comma-separated: a row passes with either.
            "resnet50.layer2.conv2.s2.fwd,resnet50.layer2.conv2.s2.wgrad",
            "--json",
            out.to_str().unwrap(),
        ]),
        &[],
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let names: std::collections::BTreeSet<&str> = rows.iter().map(|r| r["kernel"].as_str().unwrap()).collect();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["resnet50.layer2.conv2.s2.fwd", "resnet50.layer2.conv2.s2.wgrad"]
    );
    for r in &rows {
        assert_eq!(r["ok"], true, "{r}");
        // [N, H, W, C, K, R, S, stride]: the strided 3x3 of the second stage.
        assert_eq!(r["shape"].as_array().unwrap()[5..], [3, 3, 2], "{r}");
        assert!(r["gflops"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// The whole quick run (every row at small shapes: a smoke check of each kernel) checks
/// out and says each row on standard error as it is measured; a flagged row says what
/// varied.
#[test]
fn the_quick_run_checks_every_row_and_reports_as_it_goes() {
    let dir = scratch("bench-quick");
    let json = dir.join("rows.json");
    let out = wgtrain(&["bench", "--quick", "--json", json.to_str().unwrap()], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // Kernel rows (allocator rows have no reference and report nothing as they go).
    let checked: Vec<&serde_json::Value> = rows.iter().filter(|r| r["max_abs_err"].is_number()).collect();
    assert!(checked.len() > 60, "{} rows", checked.len());
    for r in &checked {
        let line = format!("  {} {} ", r["kernel"].as_str().unwrap(), r["dtype"].as_str().unwrap());
        assert!(err.contains(&line), "no progress line '{line}' in\n{err}");
        assert_eq!(r["ok"], true, "{r}");
        if let Some(flag) = r["flag"].as_str().filter(|f| f.contains("spread")) {
            assert!(flag.contains("p10") && flag.contains("p90"), "{flag}");
        }
    }
}
