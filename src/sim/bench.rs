//! A simulated `fastkernels bench`: same arguments, same JSON schema, same exit codes, with
//! deterministic outcomes instead of GPU measurements.
//!
//! Owns the simulated outcome model. It does not parse argv or sleep: the CLI's hidden
//! `fk-agentd sim-bench [--seed N] bench …` subcommand turns arguments into [`SimBenchParams`],
//! calls [`run`], writes nothing itself beyond what [`run`] wrote, and acts on the returned
//! [`SimAction`] (exit with a code, or hang until killed).
//!
//! Outcomes are a pure function of (seed, target, candidate file content) and, for a repeated
//! bench (below), its folder: the same candidate always gets the same rows in the same folder, a
//! changed candidate may get different ones. Candidate files can
//! force an outcome with a line `# sim: <knob>` (see [`Knob`]), so tests can ask for hangs,
//! crashes, infrastructure errors or an exact speedup.
//!
//! Repeated benches of one candidate differ through [`NoiseModel`]: a `# sim: true=S`
//! candidate in every bench, any other candidate in the benches scoring repeats (a
//! confirmation `…/confirm-<k>/`, a `--repeats` bench `…/rep-<k>/` after the first),
//! so its `validate` and first scoring bench agree and a confirmation has noise to judge. A
//! self-test (an A/A calibration or noise-floor bench) draws its noise per invocation too.
//! With `--timing-rounds N` (the timing patch's option) every timed row carries paired rounds
//! around its speedup (drawn from [`NoiseModel::paired`]), and its own `speedup` is the
//! figure timed as published: that times the published method's bias and one-shot noise.
//! The draws depend on the invocation's private folder: the same folder always gives the
//! same numbers.
//!
//! Invariants: every JSON written carries `"simulated": true` at the top and on every row, and
//! every row's `detail` says "simulated"; a usage error (unknown target, missing captures)
//! writes no JSON and exits 2, like the real one.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::score::result::{BenchResult, PairedTiming, ScenarioRow, Status, op_string};
use crate::target::{Catalog, Target, TargetId};

use super::noise::{NoiseModel, PUBLISHED_BIAS};

/// What the simulated bench is asked to do (the real bench's flags plus the environment it
/// reads, collected by the CLI).
#[derive(Clone, Debug, Default)]
pub struct SimBenchParams {
    pub seed: u64,
    /// Module stem or class name, as the real `--target`.
    pub target: Option<String>,
    pub level: Option<u8>,
    pub captures: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub self_test: bool,
    /// `FASTKERNELS_CANDIDATE_DIR`.
    pub candidate_dir: Option<PathBuf>,
    /// `FASTKERNELS_RESULTS_DIR` (default output folder).
    pub results_dir: Option<PathBuf>,
    /// `--timing-rounds` (the timing patch's option): above 0, every timed row carries paired
    /// rounds, and its published figure is the paired one times the published method's bias.
    pub timing_rounds: usize,
}

/// What the process should do once [`run`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimAction {
    /// Print `stdout`/`stderr` and exit with `code`.
    Exit {
        code: i32,
        stdout: String,
        stderr: String,
    },
    /// Never finish (a `# sim: hang` candidate): the caller's deadline must kill it.
    Hang { stderr: String },
}

impl SimAction {
    /// Print `stdout`/`stderr` and exit with `code`.
    pub fn exit(code: i32, stdout: impl Into<String>, stderr: impl Into<String>) -> Self {
        Self::Exit {
            code,
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }
}

/// The argv prefix that runs this simulated bench in place of `python3 -m fastkernels`
/// (`exe` is the fk-agentd binary, e.g. `std::env::current_exe()` read by the CLI).
pub fn command(exe: &Path, seed: u64) -> Vec<String> {
    vec![
        exe.to_string_lossy().into_owned(),
        "sim-bench".into(),
        "--seed".into(),
        seed.to_string(),
    ]
}

/// Outcomes a candidate file can force with a `# sim: <knob>` line.
#[derive(Clone, Debug, PartialEq)]
enum Knob {
    Hang,
    /// Exit 1 without writing JSON, like a Python traceback in the parent.
    Crash,
    /// Like `crash`, but only in a level mix (fine when benched alone).
    MixCrash,
    /// Exit 2 without JSON, like "no GPU found".
    Infra,
    /// Exit 0 without JSON, saying so on stdout only, as the real bench does when it finds no
    /// candidate it will bench (seen on an H100 for a copy of an L2 class the harness captures
    /// but does not list as a benchmark target).
    NoCandidates,
    Pass,
    Incorrect,
    RuntimeError,
    /// SKIPPED "no candidate class found", as a syntax error gives in the real bench.
    Unloadable,
    /// Every row PASSED with exactly this speedup.
    Speedup(f64),
    /// Every row PASSED with this true speedup times one [`NoiseModel`] draw per invocation.
    True(f64),
    /// Every row PASSED; bench k of a candidate (see [`confirm_index`]: 0 for the first,
    /// `confirm-<k>` in the output path) measures the k-th of these speedups (the last one
    /// repeats).
    Runs(Vec<f64>),
    /// RUNTIME_ERROR when benched beside lower-level candidates (a composed bench). Without
    /// a knob that happens by chance (1 in 4 for L2+ candidates); `pass`/`speedup=` prevent it.
    ComposeBreak,
    /// `read-file=PATH`: a candidate that reads PATH when imported: the attack on the token file
    /// through candidate code. Where the read is refused the import check ([`import`]) fails
    /// with the read's error; where it gets through, the bench's rows are all RUNTIME_ERROR
    /// with what it read in base32.
    ReadFile(PathBuf),
}

fn knobs(content: &str) -> Vec<Knob> {
    let knob = |line: &str| {
        Some(match line.trim().strip_prefix("# sim:")?.trim() {
            "hang" => Knob::Hang,
            "crash" => Knob::Crash,
            "mix-crash" => Knob::MixCrash,
            "infra" => Knob::Infra,
            "no-candidates" => Knob::NoCandidates,
            "pass" => Knob::Pass,
            "incorrect" => Knob::Incorrect,
            "runtime-error" => Knob::RuntimeError,
            "unloadable" => Knob::Unloadable,
            "compose-break" => Knob::ComposeBreak,
            w => knob_value(w)?,
        })
    };
    content.lines().filter_map(knob).collect()
}

/// `speedup=S`, `true=S`, `runs=A,B,C` (every number > 0), `read-file=PATH`.
fn knob_value(word: &str) -> Option<Knob> {
    if let Some(path) = word.strip_prefix("read-file=") {
        return Some(Knob::ReadFile(PathBuf::from(path.trim())));
    }
    let positive = |v: &str| v.trim().parse::<f64>().ok().filter(|x| *x > 0.0);
    if let Some(v) = word.strip_prefix("speedup=") {
        return positive(v).map(Knob::Speedup);
    }
    if let Some(v) = word.strip_prefix("true=") {
        return positive(v).map(Knob::True);
    }
    let v = word.strip_prefix("runs=")?;
    let runs: Option<Vec<f64>> = v.split(',').map(positive).collect();
    runs.filter(|r| !r.is_empty()).map(Knob::Runs)
}

/// The folder an invocation writes its JSON in (`<work>/bench.json`): only this one says
/// which bench of a candidate it is, whatever the folders above are called.
fn work_folder(output: &Path) -> &str {
    output
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or("")
}

/// Which bench of a candidate an output path is: 0 for the first, `…/confirm-<k>/…` → k.
fn confirm_index(output: &Path) -> usize {
    work_folder(output)
        .strip_prefix("confirm-")
        .and_then(|k| k.parse::<usize>().ok())
        .unwrap_or(0)
}

/// Whether an output path is a repeated bench of a candidate scoring benched before: a
/// confirmation (`confirm-<k>`) or a `--repeats` bench after the first (`rep-<k>`,
/// k ≥ 2).
fn is_repeat(output: &Path) -> bool {
    confirm_index(output) > 0
        || work_folder(output)
            .strip_prefix("rep-")
            .and_then(|k| k.parse::<usize>().ok())
            .is_some_and(|k| k >= 2)
}

/// The last three components of the output path: what tells one invocation from another
/// (stable for the same layout, whatever the temporary folder above it).
fn invocation_nonce(output: &Path) -> String {
    let parts: Vec<String> = output
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts[parts.len().saturating_sub(3)..].join("/")
}

/// A `pass` or `speedup=` knob: the candidate passes unless another knob says otherwise,
/// composed or not.
fn forces_pass(ks: &[Knob]) -> bool {
    ks.iter().any(|k| {
        matches!(
            k,
            Knob::Pass | Knob::Speedup(_) | Knob::True(_) | Knob::Runs(_)
        )
    })
}

/// A number in [0, 1) derived from the parts (stable across builds and platforms).
pub(crate) fn unit(parts: &[&[u8]]) -> f64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    unit_of(&h.finalize())
}

/// A number in [0, 1) from the first 8 bytes of a digest.
pub(crate) fn unit_of(digest: &[u8]) -> f64 {
    let n = u64::from_le_bytes(digest[..8].try_into().unwrap_or_default());
    (n >> 11) as f64 / (1u64 << 53) as f64
}

const DTYPES: [&str; 3] = ["bfloat16", "float16", "float32"];

/// The simulated cases of one class: 1–5 shapes, fixed per target (like fixed captures).
fn cases(target: &TargetId, class: &str) -> Vec<(String, String)> {
    let name = format!("{target}:{class}");
    let n = 1 + (unit(&[name.as_bytes(), b"cases"]) * 5.0) as usize;
    (0..n)
        .map(|i| {
            let i = i.to_string();
            let rows = 1 << (unit(&[name.as_bytes(), i.as_bytes(), b"m"]) * 14.0) as u32;
            let cols = 64 << (unit(&[name.as_bytes(), i.as_bytes(), b"n"]) * 7.0) as u32;
            let dt = DTYPES[(unit(&[name.as_bytes(), i.as_bytes(), b"d"]) * 3.0) as usize % 3];
            (format!("[{rows}, {cols}]"), dt.to_string())
        })
        .collect()
}

struct RowSpec<'a> {
    target: &'a TargetId,
    class: &'a str,
    shape: String,
    dtype: String,
}

/// How the simulated invocation times a row: the published factor multiplies the fair speedup
/// into the figure the harness would time as published; `rounds` > 0 adds paired rounds.
#[derive(Clone, Copy)]
struct Timing {
    rounds: usize,
    published: f64,
}

/// One row of `spec` from its case's outcome: status, detail and speedup, as [`Draw::case`].
fn row(
    spec: &RowSpec<'_>,
    (status, detail, speedup): (Status, &str, f64),
    timing: Timing,
) -> ScenarioRow {
    let timed = status == Status::Passed;
    let fair = speedup;
    let speedup = if timed {
        fair * timing.published
    } else {
        speedup
    };
    let base_ms = 0.01 + unit(&[spec.shape.as_bytes(), spec.class.as_bytes()]) * 0.2;
    let (matched, abs) = match status {
        Status::IncorrectNumerical => (0.62, 3.1),
        Status::Passed => (1.0, 0.0078),
        _ => (1.0, 0.0),
    };
    ScenarioRow {
        op: op_string(spec.target, spec.class),
        level: Some(spec.target.level()),
        shape: spec.shape.clone(),
        dtype: spec.dtype.clone(),
        status,
        max_abs_error: abs,
        max_rel_error: abs / 10.0,
        matched_ratio: matched,
        candidate_ms: if timed { base_ms / speedup } else { 0.0 },
        baseline_ms: if timed { base_ms } else { 0.0 },
        speedup: if timed { speedup } else { 0.0 },
        detail: if detail.is_empty() {
            "simulated".into()
        } else {
            format!("simulated: {detail}")
        },
        simulated: true,
        paired: (timed && timing.rounds > 0).then(|| paired_rounds(base_ms, fair, timing.rounds)),
    }
}

/// Paired rounds around `fair`, in the timing patch's order (ratios within ±1 %).
fn paired_rounds(base_ms: f64, fair: f64, n: usize) -> PairedTiming {
    let order: String = (0..n)
        .map(|r| {
            if (r as u32).count_ones() % 2 == 1 {
                "BC"
            } else {
                "CB"
            }
        })
        .collect();
    let rounds: Vec<[f64; 2]> = (0..n)
        .map(|r| {
            let wiggle = 1.0 + 0.01 * (((r * 7) % 5) as f64 - 2.0) / 2.0;
            [base_ms / (fair * wiggle), base_ms]
        })
        .collect();
    PairedTiming {
        speedup: fair,
        spread: 0.007,
        order,
        rounds,
        candidate_ms: base_ms / fair,
        baseline_ms: base_ms,
    }
}

/// Context for one target's rows.
struct TargetRun<'a> {
    seed: u64,
    target: &'a Target,
    /// Candidate file content; `None` when the file is missing.
    content: Option<&'a str>,
    /// Benched beside lower-level candidates (a level mix, or a target whose candidate folder
    /// holds lower-level candidates, as in a sequential campaign's sessions).
    composed_with_lower: bool,
    self_test: bool,
    /// Where this invocation writes its JSON (tells repeated benches apart).
    output: &'a Path,
    /// `--timing-rounds`.
    timing_rounds: usize,
}

impl TargetRun<'_> {
    /// A draw of this seed, target and candidate content, then `more`.
    fn unit(&self, more: &[&[u8]]) -> f64 {
        let seed = self.seed.to_le_bytes();
        let id = self.target.id.to_string();
        let content = self.content.unwrap_or("").as_bytes();
        unit(&[&[&seed[..], id.as_bytes(), content], more].concat())
    }
}

/// The draws that decide one target's outcome (a pure function of seed, target, content and,
/// for a repeated bench, its folder).
struct Draw {
    knobs: Vec<Knob>,
    /// Picks the failure mode when no knob forces one.
    u: f64,
    /// The target's typical speedup, 0.8–1.6×.
    base: f64,
    /// Broken by composition with lower-level candidates.
    broken: bool,
    /// The speedup a knob forces on every row of this invocation.
    forced: Option<f64>,
    /// A repeated bench of the same candidate (see [`is_repeat`]) measures its speedup times
    /// one [`NoiseModel`] draw; its first bench (and every `validate`) measures it as drawn.
    repeat_noise: f64,
}

impl Draw {
    fn new(t: &TargetRun<'_>) -> Self {
        let knobs = knobs(t.content.unwrap_or(""));
        let broken = t.composed_with_lower
            && t.target.id.level() > 1
            && (knobs.contains(&Knob::ComposeBreak)
                || (!forces_pass(&knobs) && t.unit(&[b"compose"]) < 0.25));
        let nonce = invocation_nonce(t.output);
        let u = |i: u8| t.unit(&[nonce.as_bytes(), &[i]]);
        let model = if t.timing_rounds > 0 {
            NoiseModel::paired()
        } else {
            NoiseModel::default()
        };
        let noise = model.factor([u(0), u(1), u(2), u(3)]);
        let forced = knobs.iter().find_map(|k| match k {
            Knob::Speedup(s) => Some(*s),
            Knob::True(s) => Some(s * noise),
            Knob::Runs(r) => Some(r[confirm_index(t.output).min(r.len() - 1)]),
            _ => None,
        });
        Self {
            u: t.unit(&[]),
            base: 0.8 + 0.8 * t.unit(&[b"speed"]),
            broken,
            repeat_noise: if is_repeat(t.output) { noise } else { 1.0 },
            knobs,
            forced,
        }
    }

    /// No file, an unloadable knob, or (4 in 100 without knobs) a simulated syntax error.
    fn unloadable(&self, t: &TargetRun<'_>) -> bool {
        !t.self_test
            && (t.content.is_none()
                || self.knobs.contains(&Knob::Unloadable)
                || (self.knobs.is_empty() && (0.2..0.24).contains(&self.u)))
    }

    /// Status, detail and speedup of case `i`; `jitter` in [0, 1) varies per case.
    fn case(&self, i: usize, jitter: f64) -> (Status, &'static str, f64) {
        let free = self.knobs.is_empty();
        let speedup = self
            .forced
            .unwrap_or(self.base * (0.95 + 0.1 * jitter) * self.repeat_noise);
        if self.broken {
            let why = "module construction failed: composition with lower-level candidates broke";
            (Status::RuntimeError, why, speedup)
        } else if self.knobs.contains(&Knob::RuntimeError)
            || (free && (0.12..0.2).contains(&self.u))
        {
            let why = "candidate forward raised: RuntimeError('simulated failure')";
            (Status::RuntimeError, why, speedup)
        } else if self.knobs.contains(&Knob::Incorrect)
            || (free && self.u < 0.12 && (i == 0 || jitter < 0.5))
        {
            let why = "only 0.6200 within atol=0.01,rtol=0.01";
            (Status::IncorrectNumerical, why, speedup)
        } else {
            (Status::Passed, "", speedup)
        }
    }
}

/// The published figure's factor over the fair one: with paired rounds, the published method's
/// bias and its own one-shot noise; without, 1 (the fair figure is the published one).
fn published_factor(t: &TargetRun<'_>) -> f64 {
    if t.timing_rounds == 0 {
        return 1.0;
    }
    let nonce = invocation_nonce(t.output);
    let u = |i: u8| t.unit(&[nonce.as_bytes(), b"published", &[i]]);
    PUBLISHED_BIAS * NoiseModel::default().factor([u(0), u(1), u(2), u(3)])
}

/// A self-test (the baseline against itself): 1.0× times one draw of the method's noise per
/// invocation, a little jitter per row, and the published method's bias when unpaired.
fn self_test_speedup(t: &TargetRun<'_>, jitter: f64) -> f64 {
    let nonce = invocation_nonce(t.output);
    let u = |i: u8| t.unit(&[nonce.as_bytes(), b"self-test", &[i]]);
    let (model, bias) = if t.timing_rounds > 0 {
        (NoiseModel::paired(), 1.0)
    } else {
        (NoiseModel::default(), PUBLISHED_BIAS)
    };
    bias * model.factor([u(0), u(1), u(2), u(3)]) * (0.99 + 0.02 * jitter)
}

fn target_rows(t: &TargetRun<'_>) -> Vec<ScenarioRow> {
    let draw = Draw::new(t);
    let timing = Timing {
        rounds: t.timing_rounds,
        published: published_factor(t),
    };
    let mut out = Vec::new();
    for class in &t.target.classes {
        let spec = |shape, dtype| RowSpec {
            target: &t.target.id,
            class,
            shape,
            dtype,
        };
        if draw.unloadable(t) {
            let spec = spec("-".into(), "-".into());
            let outcome = (Status::Skipped, "no candidate class found", 0.0);
            out.push(row(&spec, outcome, timing));
            continue;
        }
        for (i, (shape, dtype)) in cases(&t.target.id, class).into_iter().enumerate() {
            let spec = spec(shape, dtype);
            let jitter = t.unit(&[i.to_string().as_bytes()]);
            let outcome = if t.self_test {
                (Status::Passed, "self-test", self_test_speedup(t, jitter))
            } else {
                draw.case(i, jitter)
            };
            out.push(row(&spec, outcome, timing));
        }
    }
    out
}

/// Runs the simulated bench: selects targets, writes the result JSON, returns what to do.
pub fn run(params: &SimBenchParams, catalog: &Catalog) -> SimAction {
    let rows: Result<Vec<Vec<ScenarioRow>>, SimAction> = select(params, catalog)
        .and_then(|selected| selected.iter().map(|t| bench_target(params, t)).collect());
    match rows {
        Ok(rows) => finish(params, rows.into_iter().flatten().collect()),
        Err(action) => action,
    }
}

/// The targets `--level` and `--target` select (by default every target below L4), or the
/// usage error for a missing `--captures` folder or a selection that matches none.
fn select<'a>(params: &SimBenchParams, catalog: &'a Catalog) -> Result<Vec<&'a Target>, SimAction> {
    let usage = |why: String| {
        SimAction::exit(
            2,
            "",
            format!("fastkernels bench (simulated): error: {why}\n"),
        )
    };
    if let Some(c) = params.captures.as_ref().filter(|c| !c.is_dir()) {
        let why = format!("--captures {}: no such directory", c.display());
        return Err(usage(why));
    }
    let selected: Vec<&Target> = catalog
        .targets()
        .iter()
        .filter(|t| params.level.is_none_or(|l| t.id.level() == l))
        .filter(|t| params.level.is_some() || params.target.is_some() || t.id.level() < 4)
        .filter(|t| {
            params
                .target
                .as_deref()
                .is_none_or(|x| t.id.stem() == x || t.classes.iter().any(|c| c == x))
        })
        .collect();
    if selected.is_empty() {
        let level = params
            .level
            .map(|l| format!("L{l}"))
            .unwrap_or("any level".into());
        return Err(usage(format!(
            "unknown target {:?}: no module stem or class of that name at {level}",
            params.target.as_deref().unwrap_or("(all)")
        )));
    }
    Ok(selected)
}

/// One selected target's rows (none for a target without a candidate file when benching all),
/// or what a knob in its candidate forces the whole bench to do instead.
fn bench_target(params: &SimBenchParams, t: &Target) -> Result<Vec<ScenarioRow>, SimAction> {
    let content = params
        .candidate_dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join(t.id.candidate_path())).ok());
    if params.target.is_none() && content.is_none() && !params.self_test {
        return Ok(Vec::new());
    }
    let ks = knobs(content.as_deref().unwrap_or(""));
    if !params.self_test
        && let Some(action) = process_knob(&ks, &t.id, params.target.is_none())
    {
        return Err(action);
    }
    let lower = (1..t.id.level()).any(|l| has_candidates(params.candidate_dir.as_deref(), l));
    let mut these = target_rows(&TargetRun {
        seed: params.seed,
        target: t,
        content: content.as_deref(),
        composed_with_lower: lower,
        self_test: params.self_test,
        output: &output_path(params),
        timing_rounds: params.timing_rounds,
    });
    let read = ks.iter().find_map(|k| match k {
        Knob::ReadFile(path) => Some(path),
        _ => None,
    });
    if let (Some(path), false) = (read, params.self_test) {
        let why = candidate_read(path);
        for row in &mut these {
            row.status = Status::RuntimeError;
            row.detail = why.clone();
        }
    }
    Ok(these)
}

/// The simulated import check (`python3 -c SCRIPT …` of [`crate::harness::import_check`]): a
/// candidate that reads a file when imported (`# sim: read-file`) fails to load where the read
/// is refused, with the read's error, and loads quietly where it is not (it keeps what it read
/// for its bench); every other candidate loads (its other knobs act in the bench).
pub fn import(candidate: &Path) -> SimAction {
    let content = std::fs::read_to_string(candidate).unwrap_or_default();
    let refused = knobs(&content).into_iter().find_map(|k| match k {
        Knob::ReadFile(path) => std::fs::read(&path).err().map(|e| (path, e)),
        _ => None,
    });
    match refused {
        Some((path, e)) => SimAction::exit(
            1,
            format!(
                "the candidate does not load:\n{}\n",
                read_refused(&path, &e)
            ),
            "",
        ),
        None => SimAction::exit(0, "ok\n", ""),
    }
}

/// What a candidate that reads `path` when imported raises: the file's bytes in base32 where
/// it could read them (a form a plain search for the token misses), else the read's error.
fn candidate_read(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => format!(
            "module construction failed: ValueError('{}') (# sim: read-file)",
            data_encoding::BASE32_NOPAD.encode(&bytes)
        ),
        Err(e) => format!("module construction failed: {}", read_refused(path, &e)),
    }
}

/// The error a candidate's refused read of `path` raises.
fn read_refused(path: &Path, e: &std::io::Error) -> String {
    format!(
        "{CANDIDATE_READ} {}: {e} (# sim: read-file)",
        path.display()
    )
}

/// How a simulated candidate's refused read of a file begins, for the server to count.
pub const CANDIDATE_READ: &str = "the candidate's import could not read";

/// Whether the candidate folder holds any `L<level>/*.py`.
fn has_candidates(dir: Option<&Path>, level: u8) -> bool {
    let Some(dir) = dir else { return false };
    std::fs::read_dir(dir.join(format!("L{level}"))).is_ok_and(|entries| {
        entries
            .filter_map(|e| e.ok())
            .any(|e| e.path().extension().is_some_and(|x| x == "py"))
    })
}

fn process_knob(ks: &[Knob], target: &TargetId, mix: bool) -> Option<SimAction> {
    if ks.contains(&Knob::Hang) {
        return Some(SimAction::Hang {
            stderr: format!("fastkernels bench (simulated): {target} hangs (# sim: hang)\n"),
        });
    }
    if ks.contains(&Knob::Crash) || (mix && ks.contains(&Knob::MixCrash)) {
        return Some(SimAction::exit(
            1,
            "",
            format!(
                "Traceback (most recent call last):\n  simulated crash of the bench parent while benching {target} (# sim: crash)\n"
            ),
        ));
    }
    if ks.contains(&Knob::Infra) {
        return Some(SimAction::exit(
            2,
            "",
            "fastkernels bench (simulated): error: no GPU found (# sim: infra)\n",
        ));
    }
    if ks.contains(&Knob::NoCandidates) {
        return Some(SimAction::exit(
            0,
            format!(
                "No candidates to benchmark (simulated: {target}'s file does not import, # sim: no-candidates).\n"
            ),
            "",
        ));
    }
    None
}

/// The file written: the real schema in the real field order, then `simulated` (set by
/// every row too) and the seed.
#[derive(serde::Serialize)]
struct SimDoc<'a> {
    #[serde(flatten)]
    result: &'a BenchResult,
    seed: u64,
}

fn finish(params: &SimBenchParams, rows: Vec<ScenarioRow>) -> SimAction {
    let mode = if params.self_test {
        "self-test"
    } else {
        "candidate"
    };
    let mut result = BenchResult::from_rows(mode, rows);
    // Also when no row was produced (a level without candidate files).
    result.simulated = true;
    let output = output_path(params);
    let doc = SimDoc {
        result: &result,
        seed: params.seed,
    };
    let write = || -> Result<(), String> {
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&output, text).map_err(|e| e.to_string())
    };
    if let Err(why) = write() {
        let why = format!(
            "fastkernels bench (simulated): cannot write {}: {why}\n",
            output.display()
        );
        return SimAction::exit(1, "", why);
    }
    let mut stdout = String::from(
        "SIMULATED fastkernels bench: outcomes are generated, nothing was measured.\n",
    );
    for r in &result.scenarios {
        stdout.push_str(&format!(
            "{:<20} {:<60} {:<16} {:>7.3}x  {}\n",
            r.status,
            r.op,
            r.shape,
            r.fair_speedup(),
            r.detail
        ));
    }
    stdout.push_str(&format!(
        "passed {} failed {} skipped {}; results: {}\n",
        result.passed,
        result.failed,
        result.skipped,
        output.display()
    ));
    SimAction::exit(i32::from(result.failed > 0), stdout, "")
}

fn output_path(params: &SimBenchParams) -> PathBuf {
    match (&params.output, &params.results_dir) {
        (Some(o), _) => o.clone(),
        (None, Some(d)) => d.join("bench_simulated.json"),
        (None, None) => PathBuf::from("bench_simulated.json"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_import_check_refuses_only_a_candidate_whose_read_was_refused() {
        let dir = tempfile::tempdir().unwrap();
        let readable = dir.path().join("readable");
        std::fs::write(&readable, "x").unwrap();
        let candidate = |name: &str, knob: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, knob).unwrap();
            import(&p)
        };
        let code = |a: &SimAction| match a {
            SimAction::Exit { code, stdout, .. } => (*code, stdout.clone()),
            SimAction::Hang { .. } => (-1, String::new()),
        };
        let missing = dir.path().join("missing");
        let (refused, text) = code(&candidate(
            "a.py",
            format!("# sim: read-file={}\n", missing.display()),
        ));
        assert_eq!(refused, 1);
        assert!(text.contains(CANDIDATE_READ), "{text}");
        let read = candidate("b.py", format!("# sim: read-file={}\n", readable.display()));
        assert_eq!(code(&read), (0, "ok\n".to_string()));
        assert_eq!(code(&candidate("c.py", "# sim: hang\n".into())).0, 0);
    }

    #[test]
    fn knobs_are_read_from_comment_lines() {
        let ks =
            knobs("x = 1\n  # sim: hang\n# sim: speedup=1.5\n# sim: speedup=-1\n# sim: nonsense\n");
        assert_eq!(ks, vec![Knob::Hang, Knob::Speedup(1.5)]);
    }

    #[test]
    fn noise_knobs_and_the_confirmation_index_are_read() {
        let ks =
            knobs("# sim: true=1.05\n# sim: runs=1.1,0.25\n# sim: runs=1,x\n# sim: mix-crash\n");
        assert_eq!(
            ks,
            vec![
                Knob::True(1.05),
                Knob::Runs(vec![1.1, 0.25]),
                Knob::MixCrash
            ]
        );
        let p = Path::new("gen/ind/standalone/L1_gelu/confirm-3/bench.json");
        assert_eq!(confirm_index(p), 3);
        assert_eq!(confirm_index(Path::new("a/L1_gelu/bench.json")), 0);
        // Only the bench's own folder counts, not a home or session folder above it.
        for p in [
            "rep-2/confirm-7/sessions/L1/gelu/validations/001/bench.json",
            "home/rep-3/gen/L1_gelu/rep-1/bench.json",
        ] {
            assert!(!is_repeat(Path::new(p)), "{p}");
            assert_eq!(confirm_index(Path::new(p)), 0, "{p}");
        }
        assert!(is_repeat(Path::new("g/L1_gelu/rep-2/bench.json")));
        assert_eq!(invocation_nonce(p), "L1_gelu/confirm-3/bench.json");
    }

    #[test]
    fn repeats_of_a_plain_candidate_vary_while_its_first_bench_matches_its_validate() {
        let tmp = tempfile::TempDir::new().unwrap();
        let cands = tmp.path().join("cands");
        std::fs::create_dir_all(cands.join("L1")).unwrap();
        let speedups = |out: &str| -> Vec<f64> {
            let output = tmp.path().join(out);
            std::fs::create_dir_all(output.parent().unwrap()).unwrap();
            let params = SimBenchParams {
                target: Some("gelu".into()),
                level: Some(1),
                candidate_dir: Some(cands.clone()),
                output: Some(output.clone()),
                ..Default::default()
            };
            run(&params, &Catalog::embedded());
            let r = BenchResult::read(&output).unwrap();
            r.scenarios.iter().map(|s| s.speedup).collect()
        };
        // A plain candidate (no knob) whose benches pass.
        let passing = (0..50).find(|i| {
            std::fs::write(cands.join("L1/gelu.py"), format!("# variant {i}\n")).unwrap();
            let rows = speedups("probe/bench.json");
            let r = BenchResult::read(&tmp.path().join("probe/bench.json")).unwrap();
            !rows.is_empty() && r.scenarios.iter().all(|s| s.status == Status::Passed)
        });
        assert!(passing.is_some(), "no passing variant in 50");
        let first = speedups("gen/ind/standalone/L1_gelu/bench.json");
        assert_eq!(
            speedups("sessions/L1/gelu/validations/001/bench.json"),
            first
        );
        assert_eq!(
            speedups("gen/ind/standalone/L1_gelu/rep-1/bench.json"),
            first
        );
        let repeats: Vec<Vec<f64>> = ["confirm-1", "confirm-2", "confirm-3", "rep-2"]
            .iter()
            .map(|k| speedups(&format!("gen/ind/standalone/L1_gelu/{k}/bench.json")))
            .collect();
        for (i, r) in repeats.iter().enumerate() {
            assert_ne!(r, &first, "repeat {i} measured exactly the first bench");
            // One noise draw per invocation: every row moves by the same factor.
            let f = r[0] / first[0];
            assert!(r.iter().zip(&first).all(|(a, b)| (a / b - f).abs() < 1e-9));
        }
        assert_ne!(repeats[0], repeats[1]);
        // The same folder gives the same numbers.
        assert_eq!(
            speedups("gen/ind/standalone/L1_gelu/confirm-1/bench.json"),
            repeats[0]
        );
    }

    #[test]
    fn unit_is_stable_and_in_range() {
        let a = unit(&[b"seed", b"L1/gelu"]);
        assert_eq!(a, unit(&[b"seed", b"L1/gelu"]));
        assert_ne!(a, unit(&[b"seed", b"L1/gelu2"]));
        // Length-prefixed parts: moving a byte between parts changes the value.
        assert_ne!(unit(&[b"ab", b"c"]), unit(&[b"a", b"bc"]));
        assert!((0.0..1.0).contains(&a));
    }

    #[test]
    fn a_json_without_rows_still_says_simulated() {
        let tmp = tempfile::TempDir::new().unwrap();
        let params = SimBenchParams {
            level: Some(2),
            candidate_dir: Some(tmp.path().to_path_buf()),
            output: Some(tmp.path().join("out.json")),
            ..Default::default()
        };
        let action = run(&params, &Catalog::embedded());
        assert!(
            matches!(action, SimAction::Exit { code: 0, .. }),
            "{action:?}"
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(tmp.path().join("out.json")).unwrap())
                .unwrap();
        assert_eq!(
            (doc["simulated"].clone(), doc["scenarios"].clone()),
            (serde_json::json!(true), serde_json::json!([]))
        );
    }

    #[test]
    fn a_missing_captures_folder_is_a_usage_error_without_json() {
        let tmp = tempfile::TempDir::new().unwrap();
        let params = SimBenchParams {
            target: Some("gelu".into()),
            captures: Some(tmp.path().join("nope")),
            output: Some(tmp.path().join("out.json")),
            ..Default::default()
        };
        let action = run(&params, &Catalog::embedded());
        assert!(
            matches!(action, SimAction::Exit { code: 2, .. }),
            "{action:?}"
        );
        assert!(!tmp.path().join("out.json").exists());
    }
}
