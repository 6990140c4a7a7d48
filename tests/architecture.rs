//! The layout rules of the README, checked on the sources: no import cycle between the
//! engine's modules or between the files of one folder, in any of the crates, and no
//! `.rs` file over 700 lines. A file's dependencies are read from its `crate::`,
//! `super::` and `self::` paths (comments dropped); re-exports (`pub use`) are the
//! folder's table of contents, not dependencies, and a path through a re-export counts
//! as a dependency on the file that defines the item.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines in one source file.
const MAX_LINES: usize = 700;
/// Crate roots checked: (folder, root file).
const CRATES: [(&str, &str); 5] = [
    ("engine/src", "lib.rs"),
    ("src", "main.rs"),
    ("web/server/src", "lib.rs"),
    ("web/app/src", "lib.rs"),
    ("record/src", "lib.rs"),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A source file's module path: `kernels/matmul.rs` -> [kernels, matmul];
/// `kernels/mod.rs` -> [kernels]; the root file -> [].
fn module_path(crate_dir: &Path, file: &Path, root_file: &str) -> Vec<String> {
    let rel = file.strip_prefix(crate_dir).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    if last != "mod.rs" && last != root_file {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The code without `//` comments.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// Every path written after `prefix` (e.g. "crate::"), as its segments; a `{a, b::c}`
/// group yields one path per member (first two segments are enough here).
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        out.extend(segments(rest));
    }
    out
}

fn segments(s: &str) -> Vec<Vec<String>> {
    if let Some(group) = s.strip_prefix('{') {
        let mut depth = 0;
        let end = group
            .char_indices()
            .find(|&(_, c)| {
                depth += i32::from(c == '{') - i32::from(c == '}');
                depth < 0
            })
            .map_or(group.len(), |(i, _)| i);
        let mut out = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group[..end].char_indices().chain(std::iter::once((end, ','))) {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.extend(segments(group[start..i].trim()));
                    start = i + 1;
                }
                _ => {}
            }
        }
        return out;
    }
    let first = ident(s);
    if first.is_empty() {
        return Vec::new();
    }
    let mut path = vec![first.to_string()];
    if let Some(next) = s[first.len()..].strip_prefix("::") {
        let second = ident(next);
        if !second.is_empty() {
            path.push(second.to_string());
        }
    }
    vec![path]
}

/// Items a folder's module file re-exports from its children: item -> child.
fn reexports(code: &str, children: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let child = ident(rest);
        if !children.contains(child) {
            continue;
        }
        let list = &rest[child.len()..];
        for item in list.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()) {
            out.insert(item.to_string(), child.to_string());
        }
    }
    out
}

/// The file of a module path that is not a re-export line.
fn without_reexports(code: &str) -> String {
    code.split(';')
        .filter(|s| !s.trim().starts_with("pub use "))
        .collect::<Vec<_>>()
        .join(";")
}

/// Strongly connected components of more than one node.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit(
        v: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        index: &mut BTreeMap<String, usize>,
        low: &mut BTreeMap<String, usize>,
        stack: &mut Vec<String>,
        out: &mut Vec<Vec<String>>,
    ) {
        let i = index.len();
        index.insert(v.to_string(), i);
        low.insert(v.to_string(), i);
        stack.push(v.to_string());
        for w in g.get(v).into_iter().flatten() {
            if !index.contains_key(w) {
                visit(w, g, index, low, stack, out);
                let lw = low[w];
                let lv = low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if stack.contains(w) {
                let iw = index[w];
                let lv = low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if low[v] == index[v] {
            let mut comp = Vec::new();
            while let Some(w) = stack.pop() {
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                out.push(comp);
            }
        }
    }
    let (mut index, mut low, mut stack, mut out) = (BTreeMap::new(), BTreeMap::new(), Vec::new(), Vec::new());
    for v in graph.keys() {
        if !index.contains_key(v) {
            visit(v, graph, &mut index, &mut low, &mut stack, &mut out);
        }
    }
    out
}

/// For one crate: per folder (module path), the dependency graph between its files,
/// where "mod" is the folder's own module file.
fn folder_graphs(crate_dir: &Path, root_file: &str) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(crate_dir, &mut files);
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| (module_path(crate_dir, f, root_file), code(&std::fs::read_to_string(f).unwrap())))
        .collect();
    let children = |folder: &[String]| -> BTreeSet<String> {
        modules
            .keys()
            .filter(|p| p.len() == folder.len() + 1 && p.starts_with(folder))
            .map(|p| p[folder.len()].clone())
            .collect()
    };
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (path, text) in &modules {
        let is_folder_file = !children(path).is_empty() || path.is_empty();
        // The folder this file is a node of, and its name there.
        let (folder, me) = if is_folder_file && !path.is_empty() {
            (path[..path.len() - 1].to_vec(), path[path.len() - 1].clone())
        } else if path.is_empty() {
            (Vec::new(), "mod".to_string())
        } else {
            (path[..path.len() - 1].to_vec(), path[path.len() - 1].clone())
        };
        let _ = me;
        let body = without_reexports(text);
        // Targets as full module paths (an item's path ends at the folder holding it).
        let mut targets: Vec<Vec<String>> = Vec::new();
        for p in paths_after(&body, "crate::") {
            targets.push(p);
        }
        let parent: Vec<String> = if is_folder_file { path.clone() } else { folder.clone() };
        let sup_base: Vec<String> = if is_folder_file && !path.is_empty() {
            path[..path.len() - 1].to_vec()
        } else {
            folder.clone()
        };
        for p in paths_after(&body, "super::") {
            targets.push(sup_base.iter().cloned().chain(p).collect());
        }
        for p in paths_after(&body, "self::") {
            targets.push(parent.iter().cloned().chain(p).collect());
        }
        if is_folder_file {
            // A folder's own file names its children by bare paths (`server::router`).
            for child in children(path) {
                for p in paths_after(&body, &format!("{child}::")) {
                    targets.push(path.iter().cloned().chain(std::iter::once(child.clone())).chain(p).collect());
                }
            }
        }
        // Each target is an edge in every folder graph that contains both ends.
        for t in targets {
            for depth in 0..=path.len() {
                let g_folder = &path[..depth.min(path.len())];
                if !t.starts_with(g_folder) {
                    break;
                }
                let kids = children(g_folder);
                let from = if depth == path.len() {
                    "mod".to_string()
                } else {
                    path[depth].clone()
                };
                if depth == path.len() && !is_folder_file {
                    continue;
                }
                let to = match t.get(depth) {
                    Some(seg) if kids.contains(seg) => seg.clone(),
                    Some(seg) => {
                        // An item of the folder's module file, or one it re-exports.
                        let folder_text = modules.get(g_folder).map(String::as_str).unwrap_or("");
                        reexports(folder_text, &kids).get(seg).cloned().unwrap_or_else(|| "mod".to_string())
                    }
                    None => "mod".to_string(),
                };
                if from != to {
                    graphs.entry(g_folder.to_vec()).or_default().entry(from).or_default().insert(to);
                }
            }
        }
    }
    graphs
}

#[test]
fn no_import_cycles_between_modules_or_files_of_a_folder() {
    let mut found = Vec::new();
    for (dir, root_file) in CRATES {
        for (folder, graph) in folder_graphs(&root().join(dir), root_file) {
            for cycle in cycles(&graph) {
                found.push(format!("{dir}/{}: {}", folder.join("/"), cycle.join(" <-> ")));
            }
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn the_checker_sees_a_cycle() {
    let dir = std::env::temp_dir().join(format!("wgtrain-arch-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "pub mod x;\npub mod y;\npub use x::X;\n").unwrap();
    std::fs::write(dir.join("a/x.rs"), "use super::y::Y;\npub struct X;\n").unwrap();
    std::fs::write(dir.join("a/y.rs"), "use super::X; // through the re-export\npub struct Y;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::a::X;\n").unwrap();
    let graphs = folder_graphs(&dir, "lib.rs");
    let a = &graphs[&vec!["a".to_string()]];
    assert_eq!(cycles(a), vec![vec!["x".to_string(), "y".to_string()]]);
    assert!(cycles(&graphs[&Vec::new()]).is_empty());
    std::fs::write(dir.join("a/x.rs"), "use crate::b::B;\npub struct X;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::a::X;\npub struct B;\n").unwrap();
    let graphs = folder_graphs(&dir, "lib.rs");
    assert_eq!(cycles(&graphs[&Vec::new()]), vec![vec!["a".to_string(), "b".to_string()]]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_source_file_over_700_lines() {
    let mut long = Vec::new();
    for (dir, _) in CRATES {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        for f in files {
            let n = std::fs::read_to_string(&f).unwrap().lines().count();
            if n > MAX_LINES {
                long.push(format!("{} ({n} lines)", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {}", long.join(", "));
}
