//! The import graph of `src/`: no module imports back up. Read with a small parser of
//! `crate::…` paths (`use crate::a::b`, `use crate::{a, b}`, inline `crate::a::f()`), comments
//! left out; a cycle fails naming every module on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first segments of the paths after `prefix` (e.g. `crate::`) in `code`; a `{…}` group
/// gives each of its members.
fn heads<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let mut depth = 0;
                let mut start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => start = true,
                        c if c.is_whitespace() => {}
                        _ if start => {
                            out.push(ident(&group[i..]));
                            start = false;
                        }
                        _ => {}
                    }
                }
            }
            None => out.push(ident(rest)),
        }
    }
    out
}

/// The code of a file without its comments (line comments and doc comments).
fn code_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The graph of the modules directly under `dir` (`<dir>/<name>.rs` or `<dir>/<name>/`): an
/// edge for each path through `prefix` that names another of them, and for `super::` in the
/// files directly under `dir` when it is a module's folder.
/// The module of `dir` a file under it belongs to (`<name>.rs` or `<name>/…`).
fn module_of(dir: &Path, f: &Path) -> String {
    let rel = f.strip_prefix(dir).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn graph(dir: &Path, prefix: &str, with_super: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let node_of = |f: &Path| module_of(dir, f);
    let nodes: BTreeSet<String> = files
        .iter()
        .map(|f| node_of(f))
        .filter(|n| !["lib", "main", "mod"].contains(&n.as_str()))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = node_of(f);
        if !nodes.contains(&from) {
            continue;
        }
        let code = code_of(f);
        let mut to = heads(&code, prefix);
        if with_super && f.parent() == Some(dir) {
            to.extend(heads(&code, "super::"));
        }
        for t in to {
            // `lib.rs` re-exports these two at the root.
            let t = if ["Error", "Result"].contains(&t) {
                "error"
            } else {
                t
            };
            if t != from && nodes.contains(t) {
                edges.entry(from.clone()).or_default().insert(t.to_string());
            }
        }
    }
    edges
}

/// One cycle of `edges`, as the modules on it with the first repeated at the end.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut cycle = path[at..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

/// The modules that lie on a cycle of `edges`.
fn on_cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = edges
            .get(from)
            .into_iter()
            .flatten()
            .map(|s| s.as_str())
            .collect();
        while let Some(n) = stack.pop() {
            if n == to {
                return true;
            }
            if seen.insert(n) {
                stack.extend(edges.get(n).into_iter().flatten().map(|s| s.as_str()));
            }
        }
        false
    };
    edges.keys().filter(|n| reaches(n, n)).cloned().collect()
}

/// Fails naming a cycle of `edges`, with every module on one.
fn assert_acyclic(edges: &BTreeMap<String, BTreeSet<String>>, what: &str) {
    let knotted = on_cycles(edges);
    if knotted.is_empty() {
        return;
    }
    let around: BTreeMap<String, BTreeSet<String>> = edges
        .iter()
        .filter(|(n, _)| knotted.contains(*n))
        .map(|(n, to)| (n.clone(), to.intersection(&knotted).cloned().collect()))
        .collect();
    let cycle = find_cycle(&around).unwrap_or_default();
    panic!(
        "{knotted:?} lie on import cycles {what}, e.g. {}",
        cycle.join(" → ")
    );
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_parser_reads_paths_groups_and_skips_longer_names() {
    let code = "use crate::{a::X, b, c::{d, e}};\nlet x = crate::f::g(); my_crate::h();";
    assert_eq!(heads(code, "crate::"), vec!["a", "b", "c", "f"]);
    let edges = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["a".to_string(), "b".to_string(), "a".to_string()])
    );
    assert!(std::panic::catch_unwind(|| assert_acyclic(&edges, "here")).is_err());
}

#[test]
fn no_top_level_module_imports_back_up() {
    let edges = graph(&src(), "crate::", false);
    assert!(
        edges.len() > 10,
        "the parser found too few imports: {edges:?}"
    );
    assert_acyclic(&edges, "among the top-level modules");
    for leaf in ["exit", "digest", "words", "sync"] {
        assert_eq!(
            edges.get(leaf),
            None,
            "{leaf} must import nothing of the crate"
        );
    }
    let error: Vec<&String> = edges["error"].iter().collect();
    assert_eq!(error, vec!["exit"], "error imports only the exit codes");
    for (from, to) in [
        // The settings are a layer below what they configure.
        ("config", "score"),
        ("config", "gpu"),
        ("harness", "facts"),
        ("error", "daemon"),
        ("score", "facts"),
        // The simulation is stand-ins only: `app` assembles them into campaigns.
        ("sim", "agent"),
        ("sim", "daemon"),
        ("sim", "control"),
        ("sim", "scheduler"),
    ] {
        let path = edges.get(from).is_some_and(|t| t.contains(to));
        assert!(!path, "{from} imports {to} again");
    }
}

#[test]
fn no_score_module_imports_back_up() {
    let edges = graph(&src().join("score"), "crate::score::", true);
    assert_acyclic(&edges, "inside score");
}

/// The modules that own stored data (`store`, `event`, `run`: the read model) or an outside
/// format they parse at their edge (the provider's items and SSE: `llm`; codex's events and the
/// model's items kept for history: `agent`; the simulated server and bench: `sim`; tool
/// schemas and arguments: `tools`; the bench's JSON: `harness`; capture reports: `captures`;
/// TOML: `config`; HTTP bodies: `control`).
const VALUE_OWNERS: [&str; 11] = [
    "store", "event", "run", "llm", "agent", "sim", "tools", "harness", "captures", "config",
    "control",
];

/// The product lines of `src` (each file's lines before its unit tests, a `#[cfg(test)]`
/// module, comments left out) that `hit` matches, as `file:line: code`, in the files `skip`
/// (given the file's path under `src`) does not leave out.
fn product_hits(skip: impl Fn(&Path) -> bool, hit: impl Fn(&str) -> bool) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        if skip(rel) {
            continue;
        }
        let code = code_of(&f);
        let lines: Vec<&str> = code.lines().collect();
        let end = (0..lines.len())
            .find(|&i| {
                lines[i].trim() == "#[cfg(test)]"
                    && lines.get(i + 1).is_some_and(|l| l.contains("mod "))
            })
            .unwrap_or(lines.len());
        for (n, line) in lines[..end].iter().enumerate() {
            if hit(line) {
                found.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

/// Outside [`VALUE_OWNERS`], no code (tests aside) handles untyped JSON: no
/// `serde_json::Value` named or imported, no payload or detail read by index. Views, scoring,
/// the manifest and the CLI read stored data through the read model's types.
#[test]
fn stored_data_is_read_through_types_outside_the_read_model() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // Unit tests build raw events on purpose.
    let found = product_hits(
        |rel| VALUE_OWNERS.contains(&module_of(&src, &src.join(rel)).as_str()),
        |line| {
            (line.contains("serde_json") && line.contains("Value"))
                || line.contains(".payload[")
                || line.contains(".detail[")
        },
    );
    assert!(
        found.is_empty(),
        "untyped JSON outside the read model:\n{}",
        found.join("\n")
    );
}

/// The files that read the process environment themselves, and why: everything else gets it
/// from `config::Env`, read once by the CLI.
const ENV_READERS: [(&str, &str); 6] = [
    ("config/mod.rs", "Env::from_process, the one reader"),
    (
        "gpu/backend.rs",
        "the PATH a child inherits from this very process",
    ),
    (
        "confine.rs",
        "the HOME of this process, whose children the ruleset confines",
    ),
    (
        "confine/ns.rs",
        "the HOME of this process, whose children the ruleset confines",
    ),
    (
        "sim/invocations.rs",
        "the simulated bench's own process, started as a child",
    ),
    (
        "cli/score.rs",
        "the simulated bench's own process, started as a child",
    ),
];

/// Outside [`ENV_READERS`], no code (tests aside) reads the process environment: the
/// daemon's signals, the hints' `cargo run --` and Slurm's programs read `Env`.
#[test]
fn the_process_environment_is_read_only_at_its_edges() {
    let found = product_hits(
        |rel| ENV_READERS.iter().any(|(file, _)| Path::new(file) == rel),
        |line| {
            line.contains("env::var")
                || line.contains("from_env(")
                || line.contains("from_default_env")
        },
    );
    assert!(
        found.is_empty(),
        "the process environment read past Env:\n{}",
        found.join("\n")
    );
}
