//! The documentation against the code: the README's commands run as written (every
//! `--help`, and each command that needs no GPU), its config parses, every config key
//! and every environment variable the code reads is in the guide (and nothing the
//! guide lists is gone), each engine variable is read in one place, and docs/ stays a
//! handful of readable pages.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use wgtrain_engine::train::config::Config;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fenced blocks of `markdown` in language `lang`.
fn blocks(markdown: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start().strip_prefix("```")) {
            (None, Some(tag)) if tag.trim() == lang => current = Some(String::new()),
            (Some(_), Some(_)) => out.extend(current.take()),
            (Some(block), None) => {
                block.push_str(line);
                block.push('\n');
            }
            _ => {}
        }
    }
    out
}

fn wgtrain(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run wgtrain")
}

/// Every command of the README's table answers `--help`, naming the options the table
/// gives it; every `wgtrain ...` line of its shell blocks runs as written.
#[test]
fn readme_commands_run_as_written() {
    let readme = read("README.md");
    assert!(readme.lines().count() <= 150, "README.md has {} lines", readme.lines().count());
    let mut commands = 0;
    for line in readme.lines().filter(|l| l.starts_with("| `wgtrain ")) {
        let cell = line.split('`').nth(1).expect("a command cell");
        let words: Vec<&str> = cell.split_whitespace().collect();
        let help = wgtrain(&[words[1], "--help"]);
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(help.status.success(), "wgtrain {} --help failed", words[1]);
        // Options the row names, in its command cell and its description.
        for option in line
            .split(|c: char| c.is_whitespace() || c == '`' || c == ',')
            .filter(|w| w.starts_with("--"))
        {
            assert!(text.contains(option), "`wgtrain {} --help` does not mention {option}", words[1]);
        }
        commands += 1;
    }
    assert!(commands >= 7, "the README's command table lists {commands} commands");
    let mut ran = 0;
    for block in blocks(&readme, "sh") {
        for line in block.lines().map(str::trim).filter(|l| l.starts_with("wgtrain ")) {
            let args: Vec<&str> = line.split_whitespace().skip(1).collect();
            let out = wgtrain(&args);
            assert!(out.status.success(), "`{line}` failed: {}", String::from_utf8_lossy(&out.stderr));
            ran += 1;
        }
    }
    assert!(ran >= 1, "no wgtrain command in the README's shell blocks");
    // The quick start names the script that exists, with both jobs.
    let quickstart = read("quickstart.sh");
    assert!(readme.contains("./quickstart.sh main") && readme.contains("./quickstart.sh test"));
    assert!(quickstart.contains("main)") && quickstart.contains("test)"));
    assert!(read(".ci/run").contains("quickstart.sh test"));
}

/// The README's and the guide's example configs are valid configs.
#[test]
fn documented_configs_parse() {
    let mut parsed = 0;
    for doc in ["README.md", "docs/guide.md"] {
        for block in blocks(&read(doc), "toml") {
            // The guide's [parallel] example names devices this machine may not have;
            // parsing checks keys and values, not adapters.
            Config::parse(&block, &[]).unwrap_or_else(|e| panic!("{doc}: {e}\n{block}"));
            parsed += 1;
        }
    }
    assert!(parsed >= 3);
}

/// `section.key` for every key of the config (from its serialized default).
fn config_keys() -> BTreeSet<String> {
    let value = serde_json::to_value(Config::default()).expect("config serializes");
    let mut keys = BTreeSet::new();
    for (section, fields) in value.as_object().expect("sections") {
        for key in fields.as_object().expect("keys").keys() {
            keys.insert(format!("{section}.{key}"));
        }
    }
    // [model] has the keys of every kind.
    for kind in wgtrain_engine::train::config::ModelConfig::kinds() {
        for key in serde_json::to_value(kind)
            .expect("model serializes")
            .as_object()
            .expect("keys")
            .keys()
        {
            keys.insert(format!("model.{key}"));
        }
    }
    keys
}

/// The first cells of the rows of the table under `heading` in `markdown`.
fn table_keys(markdown: &str, heading: &str) -> BTreeSet<String> {
    let start = markdown.find(heading).unwrap_or_else(|| panic!("no '{heading}'"));
    markdown[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect()
}

#[test]
fn every_config_key_is_documented() {
    let documented = table_keys(&read("docs/guide.md"), "### Every key");
    let keys = config_keys();
    assert!(keys.len() > 30, "{keys:?}");
    let missing: Vec<_> = keys.difference(&documented).collect();
    let gone: Vec<_> = documented.difference(&keys).collect();
    assert!(missing.is_empty(), "config keys missing from docs/guide.md: {missing:?}");
    assert!(gone.is_empty(), "docs/guide.md documents keys the config does not have: {gone:?}");
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The variables read in `text`: the string literal after each `env::var(`,
/// `env::var_os(` or `try_from_env(`.
fn variables_read(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for call in ["env::var(\"", "env::var_os(\"", "try_from_env(\""] {
        for (i, _) in text.match_indices(call) {
            let rest = &text[i + call.len()..];
            out.push(rest[..rest.find('"').expect("a closed literal")].to_string());
        }
    }
    out
}

#[test]
fn every_environment_variable_is_documented_and_read_once() {
    let guide = read("docs/guide.md");
    let documented = table_keys(&guide, "## Environment variables");
    let mut read_anywhere = BTreeSet::new();
    for dir in ["engine/src", "src", "record/src", "web/server/src", "tests", "examples"] {
        let mut files = Vec::new();
        sources(&root().join(dir), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source");
            let vars = variables_read(&text);
            if dir == "engine/src" {
                for v in &vars {
                    let reads = vars.iter().filter(|w| *w == v).count();
                    assert_eq!(reads, 1, "{v} is read {reads} times in {}", file.display());
                }
            }
            read_anywhere.extend(vars);
        }
    }
    // Cargo's and the desktop's own variables are not ours to document.
    let foreign = [
        "CARGO_MANIFEST_DIR",
        "OUT_DIR",
        "CARGO",
        "XDG_RUNTIME_DIR",
        "WAYLAND_DISPLAY",
        "WAYLAND_SOCKET",
    ];
    let ours: BTreeSet<String> = read_anywhere.into_iter().filter(|v| !foreign.contains(&v.as_str())).collect();
    let missing: Vec<_> = ours.difference(&documented).collect();
    let gone: Vec<_> = documented.difference(&ours).collect();
    assert!(missing.is_empty(), "variables read but not in docs/guide.md: {missing:?}");
    assert!(gone.is_empty(), "docs/guide.md lists variables nothing reads: {gone:?}");
    // Each engine variable is read in one file only.
    let mut engine = Vec::new();
    sources(&root().join("engine/src"), &mut engine);
    for v in &ours {
        let files = engine
            .iter()
            .filter(|f| variables_read(&std::fs::read_to_string(f).expect("source")).contains(v))
            .count();
        assert!(files <= 1, "{v} is read in {files} engine files");
    }
}

/// docs/ is documentation: a few pages and their images, no raw run outputs.
#[test]
fn docs_stay_readable() {
    let mut files = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("docs") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    walk(&root().join("docs"), &mut files);
    let bytes: u64 = files.iter().map(|f| f.metadata().expect("metadata").len()).sum();
    assert!(files.len() <= 40, "docs/ holds {} files", files.len());
    assert!(bytes < 3 << 20, "docs/ holds {bytes} bytes");
    for f in &files {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
        assert!(["md", "png", "svg"].contains(&ext), "{} is not a page or an image", f.display());
        if ext == "md" {
            let lines = std::fs::read_to_string(f).expect("page").lines().count();
            assert!(lines <= 800, "{} has {lines} lines", f.display());
        }
    }
    // Links between the pages resolve.
    for page in ["README.md", "docs/guide.md", "docs/architecture.md", "docs/performance.md"] {
        let text = read(page);
        let base = root().join(page).parent().expect("folder").to_path_buf();
        for (i, _) in text.match_indices("](") {
            let target = &text[i + 2..];
            let target = &target[..target.find(')').expect("a closed link")];
            if target.starts_with("http") {
                continue;
            }
            let file = target.split('#').next().expect("path");
            assert!(base.join(file).exists(), "{page} links to {target}, which does not exist");
        }
    }
    // The performance page gives each table its command, date and commit.
    let perf = read("docs/performance.md");
    for section in perf.split("\n## ").skip(1) {
        let title = section.lines().next().unwrap_or("");
        if !section.contains("\n|") {
            continue;
        }
        for what in ["Command", "Date", "Commit"] {
            assert!(section.contains(&format!("{what}:")), "performance section '{title}' has no {what}");
        }
    }
}
