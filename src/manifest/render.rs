//! The Markdown manifest: pure functions from [`ManifestData`] to text, one per section, so
//! each can be snapshot-tested. No I/O, no clock: the render time is part of the data.

use std::fmt::Write as _;

use crate::facts::{FactsStage, HostFacts, SettingFact};
use crate::manifest::{ManifestData, StageCount};

/// The whole `MANIFEST.md`. A simulated run says so on the first line.
pub fn markdown(d: &ManifestData) -> String {
    let mut out = String::new();
    if d.run.simulated {
        out.push_str(
            "> **SIMULATED RUN**: scripted model, fake GPUs and simulated bench; no number below \
             measures a real kernel.\n\n",
        );
    }
    let _ = writeln!(out, "# Manifest of run {}\n", d.run.id);
    let _ = writeln!(
        out,
        "Rendered at {} from recorded facts (the store's events and the run directory); \
         re-rendering replaces this file.\n",
        d.rendered_at
    );
    out.push_str(&campaign(d));
    for section in [
        node(&d.facts),
        runtime(&d.facts),
        code(&d.facts),
        agent(d),
        settings(d),
        captures(&d.facts),
        credentials(d),
        results(d),
        archive(d),
    ] {
        out.push_str(&section);
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A Markdown table: the header, its rule, then one line per row (cells as given).
fn md_table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let rule = "---|".repeat(header.len());
    let mut out = format!("| {} |\n|{rule}\n", header.join(" | "));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

fn stage_name(f: &HostFacts) -> String {
    let stage = match f.stage {
        FactsStage::RunStart => "run start",
        FactsStage::Scoring => "scoring",
    };
    format!("{stage} ({})", f.gathered_at)
}

/// Run id, mode, times, status and session outcomes.
pub fn campaign(d: &ManifestData) -> String {
    let r = &d.run;
    let mut out = String::from("## Campaign\n\n");
    let _ = writeln!(out, "- mode: {}", r.mode);
    let _ = writeln!(out, "- targets: {}", r.targets.len());
    let finished = r.finished_at.as_deref().unwrap_or("not finished");
    let _ = writeln!(out, "- started: {}; finished: {finished}", r.started_at);
    let run_finished = d.sessions.run_status.as_deref().unwrap_or("not recorded");
    let _ = writeln!(out, "- status: {} (run_finished: {run_finished})", r.status);
    let _ = writeln!(out, "- sessions: {}", d.sessions.outcome);
    let gpu = crate::store::leases::describe_gpu_seconds(&d.gpu_seconds);
    let _ = writeln!(out, "- GPU time held by leases (grant to release): {gpu}\n");
    out
}

const NO_FACTS: &str = "No facts were recorded for this run.\n\n";

/// Host and GPUs, for each time facts were gathered.
pub fn node(facts: &[HostFacts]) -> String {
    let mut out = String::from("## Node\n\n");
    if facts.is_empty() {
        out.push_str(NO_FACTS);
        return out;
    }
    for f in facts {
        let _ = writeln!(out, "At {}:\n", stage_name(f));
        let _ = writeln!(out, "- host: {}", f.host);
        let _ = writeln!(out, "- GPUs: {}", f.gpus.summary);
        if !f.gpus.visible.is_empty() {
            let rows =
                f.gpus.visible.iter().enumerate().map(|(i, g)| {
                    vec![i.to_string(), esc(&g.name), esc(&g.memory), esc(&g.driver)]
                });
            out.push('\n');
            out.push_str(&md_table(&["#", "GPU", "memory", "driver"], rows));
        }
        out.push('\n');
    }
    out
}

/// CUDA, Python and package versions: one column per facts record.
pub fn runtime(facts: &[HostFacts]) -> String {
    let mut out = String::from("## Runtime stack\n\n");
    if facts.is_empty() {
        out.push_str(NO_FACTS);
        return out;
    }
    let stages: Vec<String> = facts.iter().map(stage_name).collect();
    let mut header = vec!["component"];
    header.extend(stages.iter().map(String::as_str));
    let row = |name: &str, get: &dyn Fn(&HostFacts) -> String| {
        let cells = facts.iter().map(|f| esc(&get(f)));
        std::iter::once(name.to_string()).chain(cells).collect()
    };
    let mut names: Vec<&String> = facts.iter().flat_map(|f| f.packages.keys()).collect();
    names.sort();
    names.dedup();
    let mut rows = vec![
        row("CUDA (nvcc)", &|f| f.cuda.clone()),
        row("Python", &|f| f.python.clone()),
    ];
    for name in names {
        rows.push(row(name, &|f| {
            f.packages
                .get(name)
                .cloned()
                .unwrap_or_else(|| "not probed".into())
        }));
    }
    out.push_str(&md_table(&header, rows));
    out.push('\n');
    out
}

/// Index of the facts a section describes: those of the run start (the campaign's own),
/// else the latest (a run that was only scored).
fn primary_index(facts: &[HostFacts]) -> Option<usize> {
    facts
        .iter()
        .position(|f| f.stage == FactsStage::RunStart)
        .or(facts.len().checked_sub(1))
}

fn primary(facts: &[HostFacts]) -> Option<&HostFacts> {
    primary_index(facts).map(|i| &facts[i])
}

/// The records other than [`primary`], in order.
fn others(facts: &[HostFacts]) -> impl Iterator<Item = &HostFacts> {
    let skip = primary_index(facts);
    facts
        .iter()
        .enumerate()
        .filter(move |(i, _)| Some(*i) != skip)
        .map(|(_, f)| f)
}

fn fastkernels_text(f: &HostFacts) -> String {
    let k = &f.fastkernels;
    let dirty = match k.dirty {
        Some(true) => "uncommitted changes in the checkout (not carried into the copy)",
        Some(false) => "clean checkout",
        None => "local changes unknown",
    };
    match &k.checkout {
        Some(dir) => format!("{} at commit {}: {dirty}", dir.display(), k.commit),
        None => "checkout not configured (commit unknown)".into(),
    }
}

/// fk-agentd and fastkernels: commits, local changes, and how the patches were verified.
pub fn code(facts: &[HostFacts]) -> String {
    let mut out = String::from("## Code\n\n");
    let Some(f) = primary(facts) else {
        out.push_str(NO_FACTS);
        return out;
    };
    let b = &f.fk_agentd;
    let _ = writeln!(
        out,
        "- fk-agentd {} at commit {} ({})",
        b.version, b.commit, b.commit_source
    );
    let _ = writeln!(out, "- fastkernels: {}", fastkernels_text(f));
    let k = &f.fastkernels;
    if let Some(copy) = &k.copy {
        let _ = writeln!(
            out,
            "- benches ran from a private copy at {} (`git archive` of that commit, then the patches below)",
            copy.display()
        );
    }
    if let Some(d) = &k.patch_decision {
        let _ = writeln!(
            out,
            "- patch series: {} (`fastkernels.patches = \"{}\"`): {}",
            d.series_words(),
            esc(&d.setting),
            esc(&d.reason)
        );
    }
    if k.patches.is_empty() {
        out.push_str("- patches: none recorded\n");
    } else {
        out.push('\n');
        out.push_str(&patch_table(&k.patches));
    }
    let later: Vec<String> = others(facts)
        .map(|o| {
            format!(
                "- at {}: fk-agentd {} at commit {}; fastkernels: {}\n",
                stage_name(o),
                o.fk_agentd.version,
                o.fk_agentd.commit,
                fastkernels_text(o)
            )
        })
        .collect();
    if !later.is_empty() {
        out.push_str("\nRecorded again later:\n\n");
        out.push_str(&later.concat());
    }
    out.push('\n');
    out
}

/// Each patch, its hash, and the result of every check that proved it applied.
fn patch_table(patches: &[crate::harness::patches::AppliedPatch]) -> String {
    let rows = patches.iter().map(|p| {
        let checks: Vec<String> = p
            .checks
            .iter()
            .map(|c| {
                format!(
                    "{} `{}` in {}: expected {}, found {}",
                    if c.passed { "verified" } else { "FAILED" },
                    c.check.needle,
                    c.check.file,
                    c.check.count,
                    c.found,
                )
            })
            .collect();
        vec![esc(&p.name), p.sha256.clone(), esc(&checks.join("; "))]
    });
    md_table(&["patch", "sha256", "checks"], rows)
}

/// The model provider and the prompt the campaign used (its run-start facts: a later
/// `score` may name another provider, which did not write these candidates).
pub fn agent(d: &ManifestData) -> String {
    let mut out = String::from("## Agent\n\n");
    let campaign = d.facts.iter().find(|f| f.stage == FactsStage::RunStart);
    match campaign.or(d.facts.last()) {
        None => out.push_str(NO_FACTS),
        Some(f) => {
            match &f.provider {
                Some(p) => {
                    let _ = writeln!(out, "- backend: {} ({})", p.name, p.origin);
                    let _ = writeln!(out, "- model: {}", p.model);
                    let _ = writeln!(out, "- reasoning effort: {}", p.reasoning_effort);
                    let _ = writeln!(out, "- API: {}", p.api);
                }
                None if f.simulated => {
                    out.push_str("- backend: the embedded simulation (scripted Responses server)\n")
                }
                None => out.push_str("- backend: not recorded\n"),
            }
            let sha = &f.prompt_template_sha256;
            let _ = writeln!(out, "- optimize prompt template sha256: {sha}");
        }
    }
    if !d.prompt_hashes.is_empty() {
        let rows = d
            .prompt_hashes
            .iter()
            .map(|(t, h)| vec![t.clone(), h.clone()]);
        out.push('\n');
        out.push_str(&md_table(&["target", "prompt sha256"], rows));
    }
    out.push('\n');
    out
}

/// Every setting, its value and where it came from.
pub fn settings(d: &ManifestData) -> String {
    let mut out = String::from("## Harness settings\n\n");
    let run_start = d.facts.iter().find(|f| f.stage == FactsStage::RunStart);
    let map = match (run_start, d.facts.last()) {
        (Some(f), _) => &f.settings,
        (None, Some(f)) if d.run_started_settings.is_empty() => &f.settings,
        _ => &d.run_started_settings,
    };
    if map.is_empty() {
        out.push_str("No settings were recorded.\n\n");
        return out;
    }
    out.push_str(&settings_table(map.iter()));
    out.push('\n');
    for o in d.facts.iter().filter(|f| f.stage == FactsStage::Scoring) {
        let changed: Vec<(&String, &SettingFact)> = o
            .settings
            .iter()
            .filter(|(k, v)| map.get(*k) != Some(*v))
            .collect();
        if !changed.is_empty() {
            let _ = writeln!(
                out,
                "Settings of the scoring at {} that differ from the campaign's:\n",
                o.gathered_at
            );
            out.push_str(&settings_table(changed.into_iter()));
            out.push('\n');
        }
    }
    out
}

fn settings_table<'a>(rows: impl Iterator<Item = (&'a String, &'a SettingFact)>) -> String {
    let rows = rows.map(|(k, s)| vec![k.clone(), esc(&s.value), esc(&s.source)]);
    md_table(&["setting", "value", "source"], rows)
}

/// The captures folder: content hash and where its files came from.
pub fn captures(facts: &[HostFacts]) -> String {
    let mut out = String::from("## Captured inputs\n\n");
    let Some(c) = primary(facts).map(|f| &f.captures) else {
        out.push_str(NO_FACTS);
        return out;
    };
    let _ = writeln!(out, "- folder: {}", c.dir.display());
    match &c.sha256 {
        Some(h) => {
            let _ = writeln!(
                out,
                "- content sha256: {h} ({} files, {} bytes; sorted relative paths + contents)",
                c.files, c.bytes
            );
        }
        None => {
            let _ = writeln!(out, "- content sha256: not computed ({})", c.note);
        }
    }
    for o in others(facts) {
        let same = if o.captures.dir == c.dir && o.captures.sha256 == c.sha256 {
            "the same folder and content"
        } else {
            "DIFFERENT from the above"
        };
        let _ = writeln!(
            out,
            "- at {}: {} sha256 {} ({same})",
            stage_name(o),
            o.captures.dir.display(),
            o.captures.sha256.as_deref().unwrap_or("not computed")
        );
    }
    if !c.readme_rows.is_empty() {
        let rows = c
            .readme_rows
            .iter()
            .map(|row| row.iter().map(|c| esc(c)).collect());
        out.push_str("\nProvenance (captures/README.md):\n\n");
        out.push_str(&md_table(&["path", "what", "source"], rows));
    }
    if !c.derived_from.is_empty() {
        out.push_str("\nDerived files (`_derived_from`):\n\n");
        for (file, from) in &c.derived_from {
            let _ = writeln!(out, "- {file} ← {from}");
        }
    }
    out.push('\n');
    out
}

/// Where the token came from and when it was re-read; never its value.
pub fn credentials(d: &ManifestData) -> String {
    let mut out = String::from("## Credentials\n\n");
    match d.facts.last().and_then(|f| f.provider.as_ref()) {
        Some(p) => {
            let source = &p.token_source;
            let _ = writeln!(out, "- token read from: {source} (value never recorded)");
        }
        None if d.run.simulated => out.push_str("- token: none (the simulation needs no token)\n"),
        None => out.push_str("- token: none (no provider recorded)\n"),
    }
    if d.rotations.is_empty() {
        out.push_str("- token rotations: none recorded\n\n");
        return out;
    }
    // Sessions re-read the token at every start: list the rotations (value changed) and the
    // first and last read, and count the rest.
    let changed = d.rotations.iter().filter(|r| r.changed).count();
    let _ = writeln!(
        out,
        "- token re-read {} time(s); {changed} of them found a new value (a rotation)",
        d.rotations.len()
    );
    let last = d.rotations.len().saturating_sub(1);
    let rows = d
        .rotations
        .iter()
        .enumerate()
        .filter(|(i, r)| r.changed || *i == 0 || *i == last)
        .map(|(i, r)| {
            let rotated = match (r.changed, i) {
                (true, _) => "yes",
                (false, 0) => "first read",
                (false, _) => "last read",
            };
            vec![r.at.clone(), esc(&r.age), esc(&r.reason), rotated.into()]
        });
    out.push('\n');
    out.push_str(&md_table(
        &["re-read at", "token age", "reason", "rotated"],
        rows,
    ));
    out.push('\n');
    out
}

fn stage_text(s: &StageCount) -> String {
    let what = match s.stage.as_str() {
        "ind" => "standalone (ind)",
        "comp" => "composed (comp)",
        "seq" => "sequential (seq)",
        other => other,
    };
    match s.published {
        Some(p) => format!(
            "{what}: {} confirmed winners of {} judged (published gate, one bench: {p})",
            s.winners, s.judged
        ),
        None => format!("{what}: {} winners of {} judged", s.winners, s.judged),
    }
}

/// Result generations with their verdict counts.
pub fn results(d: &ManifestData) -> String {
    let mut out = String::from("## Results\n\n");
    if d.results.iter().all(|g| !g.scored && g.stages.is_empty()) {
        out.push_str("Not scored yet.\n\n");
        return out;
    }
    for g in &d.results {
        let sim = if g.simulated {
            " — SIMULATED bench"
        } else {
            ""
        };
        let sequential = g.stages.iter().any(|s| s.stage == "seq");
        let mode = g.mode.as_deref().unwrap_or(if sequential {
            "sequential"
        } else {
            "unknown mode"
        });
        let _ = writeln!(out, "### {}/ ({mode}){sim}\n", g.dir);
        if !g.scored && !sequential {
            out.push_str("- no score.json (scoring did not finish)\n");
        }
        if let Some(t) = &g.timing {
            let _ = writeln!(out, "- timing: {}", esc(t));
        }
        if let Some(c) = &g.calibration {
            let _ = writeln!(out, "- calibration: {}", esc(c));
        }
        for s in &g.stages {
            let _ = writeln!(out, "- {}", stage_text(s));
        }
        if let Some((name, kept, dropped)) = &g.final_set {
            let _ = writeln!(out, "- final set {name}: {kept} kernels, {dropped} dropped");
        }
        match g.compare_bytes {
            Some(n) => {
                let _ = writeln!(out, "- compare.json: {n} bytes");
            }
            None => out.push_str("- compare: not run\n"),
        }
        for i in &g.incomplete {
            let _ = writeln!(out, "- INCOMPLETE: {}", esc(i));
        }
        for lines in &g.e2e {
            let mut lines = lines.iter();
            if let Some(head) = lines.next() {
                let _ = writeln!(out, "- {}", esc(head));
            }
            for l in lines {
                let _ = writeln!(out, "  - {}", esc(l));
            }
        }
        out.push('\n');
    }
    out
}

/// Every file of the run directory (the manifests themselves excluded).
pub fn archive(d: &ManifestData) -> String {
    let mut out = String::from("## Archive contents\n\n");
    let total: u64 = d.archive.iter().map(|a| a.bytes).sum();
    let _ = writeln!(
        out,
        "{} files, {total} bytes (MANIFEST.md and manifest.json not counted).\n",
        d.archive.len()
    );
    let rows = d
        .archive
        .iter()
        .map(|a| vec![esc(&a.path), a.bytes.to_string()]);
    out.push_str(&md_table(&["file", "bytes"], rows));
    out
}
