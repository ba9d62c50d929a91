//! What a capture folder holds: its reports (`*.json` with an `operators` map, searched
//! recursively like the real bench), each operator's init and forward calls, and the forward
//! cases a bench can build from them.
//!
//! Owns [`CaptureReport`] and [`Coverage`] (per target: cases, shapes, dtypes, reports). It
//! reads only what it needs of a report (the `generation` section of an LLM report, which
//! holds every response and makes it megabytes long, is skipped unparsed by type).
//!
//! Invariants: a target is "captured" when at least one report has a forward variant of one
//! of its classes; init-only operators and L4 models are listed but never count as cases;
//! operator keys outside `fastkernels.tasks.baseline.` are ignored, as the bench does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::target::{Target, TargetId};

/// GPU names recognised as a folder of the published layout (`captures/default/<gpu>/…`).
const GPU_FOLDERS: &[&str] = &["b200", "h200", "h100", "a100", "gb200", "b300", "l40s"];

/// One forward variant: how often it was called, its tensor shapes and dtypes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Case {
    pub class: String,
    pub count: u64,
    /// Up to four input shapes, `[64, 4096],[4096]`, or `scalar` when no tensor is passed.
    pub shapes: String,
    pub dtypes: BTreeSet<String>,
}

/// One operator of a report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OperatorUse {
    pub init_calls: u64,
    pub forward_calls: u64,
    pub cases: Vec<Case>,
}

/// One capture report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CaptureReport {
    /// Relative to the captures folder, `/`-separated.
    pub path: String,
    /// The GPU named by a folder of its path (`h200`), if any.
    pub gpu: Option<String>,
    pub model: String,
    pub workload: String,
    pub dtype: String,
    /// `module:Class` → its use.
    pub operators: BTreeMap<String, OperatorUse>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RawReport {
    model: String,
    workload: String,
    dtype: String,
    operators: Option<BTreeMap<String, RawOperator>>,
}

#[derive(Deserialize)]
struct RawOperator {
    init: Option<RawPhase>,
    forward: Option<RawPhase>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RawPhase {
    calls: u64,
    variants: Vec<RawVariant>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RawVariant {
    count: u64,
    args: serde_json::Value,
}

/// `fastkernels.tasks.baseline.L2.encoder_mlp:EncoderOutput` → (`L2/encoder_mlp`, class).
pub fn parse_key(key: &str) -> Option<(TargetId, String)> {
    let (module, class) = key.split_once(':')?;
    let rest = module.split(".tasks.baseline.").nth(1)?;
    let (level, stem) = rest.split_once('.')?;
    let level: u8 = level.strip_prefix('L')?.parse().ok()?;
    Some((TargetId::new(level, stem).ok()?, class.to_string()))
}

fn shape_text(args: &serde_json::Value) -> (String, BTreeSet<String>) {
    let mut shapes = Vec::new();
    let mut dtypes = BTreeSet::new();
    if let Some(map) = args.as_object() {
        for v in map.values() {
            if let Some(shape) = v.get("shape").and_then(|s| s.as_array()) {
                let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
                shapes.push(format!("[{}]", dims.join(", ")));
                if let Some(d) = v.get("dtype").and_then(|d| d.as_str()) {
                    dtypes.insert(d.trim_start_matches("torch.").to_string());
                }
            }
        }
    }
    shapes.truncate(4);
    let text = if shapes.is_empty() {
        "scalar".to_string()
    } else {
        shapes.join(",")
    };
    (text, dtypes)
}

impl CaptureReport {
    /// Parses the report at `path` in the captures folder `dir`; `None` for a JSON file that is
    /// no capture report (no `operators`). Its GPU is the one a folder of `path` names, else
    /// the one of `dir`.
    pub fn parse(dir: &Path, path: &str, bytes: &[u8]) -> Result<Option<Self>, serde_json::Error> {
        let raw: RawReport = serde_json::from_slice(bytes)?;
        let Some(ops) = raw.operators else {
            return Ok(None);
        };
        let operators = ops
            .into_iter()
            .filter(|(key, _)| key.contains(".tasks.baseline."))
            .map(|(key, op)| {
                let class = key.rsplit(':').next().unwrap_or_default().to_string();
                let forward = op.forward.unwrap_or_default();
                let cases = forward
                    .variants
                    .iter()
                    .map(|v| {
                        let (shapes, dtypes) = shape_text(&v.args);
                        Case {
                            class: class.clone(),
                            count: v.count,
                            shapes,
                            dtypes,
                        }
                    })
                    .collect();
                let use_ = OperatorUse {
                    init_calls: op.init.map_or(0, |i| i.calls),
                    forward_calls: forward.calls,
                    cases,
                };
                (key, use_)
            })
            .collect();
        let gpu = path
            .split('/')
            .find(|c| GPU_FOLDERS.contains(&c.to_ascii_lowercase().as_str()))
            .map(str::to_string)
            .or_else(|| gpu_of(dir));
        Ok(Some(Self {
            path: path.to_string(),
            gpu,
            model: raw.model,
            workload: raw.workload,
            dtype: raw.dtype.trim_start_matches("torch.").to_string(),
            operators,
        }))
    }
}

/// The GPU a folder of `path` names (the innermost), if any.
fn gpu_of(path: &Path) -> Option<String> {
    path.components()
        .rev()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| GPU_FOLDERS.contains(&c.to_ascii_lowercase().as_str()))
        .map(str::to_string)
}

/// Every capture report under `dir` (sorted by path); a JSON file that does not parse is an
/// error naming it, one without `operators` is skipped (as the bench skips it).
pub fn read_dir(dir: &Path) -> Result<Vec<CaptureReport>, String> {
    let files = crate::digest::files_under(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for rel in files.iter().filter(|f| f.ends_with(".json")) {
        let path = dir.join(rel);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let report = CaptureReport::parse(dir, rel, &bytes);
        out.extend(report.map_err(|e| format!("{}: {e}", path.display()))?);
    }
    Ok(out)
}

/// What the captures hold for one target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    pub classes: BTreeSet<String>,
    /// Distinct forward variants (class, shapes, dtypes) over every report: what the bench
    /// picks its cases from.
    pub cases: usize,
    pub calls: u64,
    pub shapes: BTreeSet<String>,
    pub dtypes: BTreeSet<String>,
    /// Reports holding a forward variant.
    pub reports: BTreeSet<String>,
    /// Reports naming an operator of the target with init calls only.
    pub init_only: BTreeSet<String>,
}

/// Per target (L1–L3, every operator key the reports name), what the captures hold.
pub fn coverage(reports: &[CaptureReport]) -> BTreeMap<TargetId, Coverage> {
    let mut out: BTreeMap<TargetId, Coverage> = BTreeMap::new();
    let mut distinct: BTreeMap<TargetId, BTreeSet<String>> = BTreeMap::new();
    for r in reports {
        for (key, op) in &r.operators {
            let Some((id, class)) = parse_key(key).filter(|(id, _)| id.level() <= 3) else {
                continue;
            };
            let c = out.entry(id.clone()).or_default();
            c.classes.insert(class);
            if op.cases.is_empty() {
                c.init_only.insert(r.path.clone());
                continue;
            }
            c.calls += op.forward_calls;
            c.reports.insert(r.path.clone());
            for case in &op.cases {
                c.shapes.insert(case.shapes.clone());
                c.dtypes.extend(case.dtypes.iter().cloned());
                let dtypes: Vec<&str> = case.dtypes.iter().map(String::as_str).collect();
                let key = format!("{}|{}|{}", case.class, case.shapes, dtypes.join(","));
                distinct.entry(id.clone()).or_default().insert(key);
            }
        }
    }
    for (id, c) in &mut out {
        c.cases = distinct.get(id).map_or(0, BTreeSet::len);
        c.init_only.retain(|r| !c.reports.contains(r));
    }
    out
}

/// The targets the reports name (L1–L3), with their classes: a catalog extension for ids the
/// default list lacks.
pub fn targets_of(cov: &BTreeMap<TargetId, Coverage>) -> Vec<Target> {
    cov.iter()
        .map(|(id, c)| Target {
            id: id.clone(),
            classes: c.classes.iter().cloned().collect(),
        })
        .collect()
}

/// The targets with at least one forward case.
pub fn captured_ids(cov: &BTreeMap<TargetId, Coverage>) -> BTreeSet<TargetId> {
    cov.iter()
        .filter(|(_, c)| c.cases > 0)
        .map(|(id, _)| id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_level_stem_and_class_and_others_are_ignored() {
        let (id, class) =
            parse_key("fastkernels.tasks.baseline.L2.encoder_mlp:EncoderOutput").unwrap();
        assert_eq!(
            (id.to_string(), class.as_str()),
            ("L2/encoder_mlp".into(), "EncoderOutput")
        );
        assert_eq!(parse_key("fastkernels.infra.engine:LlamaEngine"), None);
    }

    #[test]
    fn init_only_operators_are_listed_but_have_no_case() {
        let json = br#"{"model":"m","workload":"w","dtype":"torch.float16","generation":{"responses":[1,2]},
          "operators":{
            "fastkernels.tasks.baseline.L1.gelu:GELU":{"forward":{"calls":3,"variants":[{"count":3,"args":{"x":{"shape":[2,4],"dtype":"float16"}}}]}},
            "fastkernels.tasks.baseline.L3.layer:Layer":{"init":{"calls":1,"variants":[]}},
            "fastkernels.tasks.baseline.L4.model:Model":{"forward":{"calls":1,"variants":[{"count":1,"args":{}}]}}}}"#;
        let r = CaptureReport::parse(Path::new(""), "default/h200/x/report.json", json)
            .unwrap()
            .unwrap();
        assert_eq!(r.gpu.as_deref(), Some("h200"));
        assert_eq!(r.dtype, "float16");
        let cov = coverage(&[r]);
        let ids: Vec<String> = cov.keys().map(ToString::to_string).collect();
        assert_eq!(ids, ["L1/gelu", "L3/layer"]);
        let captured: Vec<String> = captured_ids(&cov).iter().map(ToString::to_string).collect();
        assert_eq!(captured, ["L1/gelu"]);
        let gelu = &cov[&"L1/gelu".parse().unwrap()];
        assert_eq!(gelu.shapes.iter().collect::<Vec<_>>(), ["[2, 4]"]);
    }
}
