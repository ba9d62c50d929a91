//! The `{{shapes}}` fact of the optimize prompt: how a target was called in the captures.
//!
//! Reads every capture report (`*.json` with an `operators` object) under the captures
//! directory, keeps the operators `fastkernels.tasks.baseline.L<n>.<stem>:<Class>` of the
//! target, merges identical call variants across reports (adding their counts) and lists them
//! most frequent first, in the argument order the capture recorded. Files that are not
//! capture reports are skipped, as the bench itself skips them.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::Value;

use crate::target::Target;

#[derive(Debug, thiserror::Error)]
pub enum ShapesError {
    #[error("cannot read captures directory `{}`: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Call arguments in recorded order (`serde_json::Map` would sort them).
#[derive(Clone, Debug, Default, PartialEq)]
struct OrderedArgs(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedArgs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedArgs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of call arguments")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<OrderedArgs, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(OrderedArgs(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct Report {
    operators: BTreeMap<String, Operator>,
}

#[derive(Deserialize, Default)]
struct Operator {
    #[serde(default)]
    init: Calls,
    #[serde(default)]
    forward: Calls,
}

#[derive(Deserialize, Default)]
struct Calls {
    #[serde(default)]
    variants: Vec<Variant>,
}

#[derive(Deserialize)]
struct Variant {
    #[serde(default)]
    count: u64,
    #[serde(default)]
    args: OrderedArgs,
}

/// Calls merged across reports: rendered argument text → count.
#[derive(Default)]
struct Merged {
    init: BTreeMap<String, u64>,
    forward: BTreeMap<String, u64>,
    reports: usize,
}

/// Lists the captured calls of `target`, at most `max_variants` forward variants per class.
pub fn captured_shapes(
    captures: &Path,
    target: &Target,
    max_variants: usize,
) -> Result<String, ShapesError> {
    let mut files = Vec::new();
    collect_json(captures, &mut files)?;
    files.sort();
    let prefix = format!(
        "fastkernels.tasks.baseline.L{}.{}:",
        target.id.level(),
        target.id.stem()
    );
    let mut by_class: BTreeMap<&str, Merged> = BTreeMap::new();
    for file in &files {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        let Ok(report) = serde_json::from_str::<Report>(&text) else {
            continue;
        };
        for class in &target.classes {
            let Some(op) = report.operators.get(&format!("{prefix}{class}")) else {
                continue;
            };
            let merged = by_class.entry(class.as_str()).or_default();
            merged.reports += 1;
            for v in &op.init.variants {
                *merged.init.entry(render_args(&v.args)).or_default() += v.count;
            }
            for v in &op.forward.variants {
                *merged.forward.entry(render_args(&v.args)).or_default() += v.count;
            }
        }
    }
    let mut out = String::new();
    for class in &target.classes {
        match by_class.get(class.as_str()) {
            Some(m) => render_class(&mut out, class, m, max_variants),
            None => out.push_str(&format!(
                "`{class}`: no captured calls under `{}`\n",
                captures.display()
            )),
        }
    }
    Ok(out.trim_end().to_string())
}

fn render_class(out: &mut String, class: &str, m: &Merged, max_variants: usize) {
    let mut forward: Vec<(&String, &u64)> = m.forward.iter().collect();
    forward.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    out.push_str(&format!(
        "`{class}` forward calls ({} variants from {} capture report(s), most frequent first):\n",
        forward.len(),
        m.reports
    ));
    for (args, count) in forward.iter().take(max_variants) {
        out.push_str(&format!("- {count} calls: {args}\n"));
    }
    if forward.len() > max_variants {
        out.push_str(&format!(
            "- … and {} rarer variant(s)\n",
            forward.len() - max_variants
        ));
    }
    for (args, count) in &m.init {
        out.push_str(&format!("  constructed ({count}×) with: {args}\n"));
    }
}

fn render_args(args: &OrderedArgs) -> String {
    if args.0.is_empty() {
        return "(no arguments)".into();
    }
    args.0
        .iter()
        .map(|(k, v)| format!("{k}={}", render_value(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn render_value(v: &Value) -> String {
    let Value::Object(o) = v else {
        return match v {
            Value::Null => "None".into(),
            other => other.to_string(),
        };
    };
    if let Some(shape) = o.get("shape") {
        let dtype = o.get("dtype").and_then(Value::as_str).unwrap_or("?");
        let mut s = format!("{} {dtype}", compact(shape));
        if let Some(stride) = o.get("stride") {
            s.push_str(&format!(" stride {}", compact(stride)));
        }
        return s;
    }
    if let (Some(dtype), 1) = (o.get("dtype").and_then(Value::as_str), o.len()) {
        return dtype.to_string();
    }
    v.to_string()
}

/// `[4096,14336]` → `[4096, 14336]`, the way Python prints shapes.
fn compact(v: &Value) -> String {
    match v {
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(compact).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ShapesError> {
    let entries = fs::read_dir(dir).map_err(|source| ShapesError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            collect_json(&path, out)?;
        } else if path.extension().and_then(|e| e.to_str()) == Some("json") {
            out.push(path);
        }
    }
    Ok(())
}
