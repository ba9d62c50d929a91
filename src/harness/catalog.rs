//! The targets a fastkernels checkout offers, read statically: every
//! `tasks/baseline/L<n>/<stem>.py` (under the checkout's `fastkernels/` package, or at its
//! root when the checkout is the package itself) and the baseline classes it defines.
//!
//! No Python runs here. Classes are the module's `__targets__` list when it declares one (as
//! fastkernels' own static discovery honours it), otherwise every top-level `class` whose name
//! does not start with `_`. A file with no class, or whose stem cannot be a target id, is
//! skipped. Helper classes that are not `nn.Module`s may be listed too: the catalog only needs
//! the stem to be right, and the primary class is the first.

use std::path::{Path, PathBuf};

use super::HarnessError;
use crate::target::{Target, TargetId};

/// The baseline folder of a checkout: `<dir>/fastkernels/tasks/baseline`, else
/// `<dir>/tasks/baseline`.
pub fn baseline_root(checkout: &Path) -> Option<PathBuf> {
    [
        checkout.join("fastkernels/tasks/baseline"),
        checkout.join("tasks/baseline"),
    ]
    .into_iter()
    .find(|p| p.is_dir())
}

/// Every L1–L4 target of the checkout, ordered by level then stem.
pub fn read_checkout(checkout: &Path) -> Result<Vec<Target>, HarnessError> {
    let root = baseline_root(checkout).ok_or_else(|| HarnessError::Checkout {
        path: checkout.to_path_buf(),
        why: "no fastkernels/tasks/baseline/ folder".into(),
    })?;
    let mut out = Vec::new();
    for level in 1..=4u8 {
        let dir = root.join(format!("L{level}"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Some(stem) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".py"))
                .filter(|stem| !stem.starts_with('_'))
            else {
                continue;
            };
            let Ok(id) = TargetId::new(level, stem) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let classes = classes_of(&text);
            if !classes.is_empty() {
                out.push(Target { id, classes });
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The target classes of one module's source.
pub fn classes_of(source: &str) -> Vec<String> {
    if let Some(listed) = declared_targets(source) {
        return listed;
    }
    source
        .lines()
        .filter_map(|l| l.strip_prefix("class "))
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty() && !name.starts_with('_')).then_some(name)
        })
        .collect()
}

/// `__targets__ = ["A", "B"]` (possibly over several lines), when the module declares it.
fn declared_targets(source: &str) -> Option<Vec<String>> {
    let at = source
        .lines()
        .position(|l| l.trim_start().starts_with("__targets__") && l.contains('='))?;
    let text: String = source
        .lines()
        .skip(at)
        .take(20)
        .collect::<Vec<_>>()
        .join("\n");
    let open = text.find(['[', '('])?;
    let close = text[open..].find([']', ')'])? + open;
    let names = text[open + 1..close]
        .split(',')
        .map(|w| w.trim().trim_matches(['"', '\'']).to_string())
        .filter(|w| !w.is_empty())
        .collect();
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_come_from_targets_or_public_top_level_classes() {
        let plain = "import torch\nclass _Helper:\n    pass\nclass GELU(nn.Module):\n    class Inner: pass\nclass Fast(GELU):\n    pass\n";
        assert_eq!(classes_of(plain), ["GELU", "Fast"]);
        let declared = "__targets__ = [\n    \"Router\",\n    'MoE',\n]\nclass Router: pass\nclass Other: pass\n";
        assert_eq!(classes_of(declared), ["Router", "MoE"]);
    }

    #[test]
    fn a_checkout_offers_its_baseline_modules() {
        let tmp = tempfile::tempdir().unwrap();
        let l1 = tmp.path().join("fastkernels/tasks/baseline/L1");
        std::fs::create_dir_all(&l1).unwrap();
        std::fs::write(l1.join("gelu.py"), "class GELU:\n    pass\n").unwrap();
        std::fs::write(l1.join("__init__.py"), "").unwrap();
        std::fs::write(l1.join("helpers.py"), "def f(): pass\n").unwrap();
        let got: Vec<String> = read_checkout(tmp.path())
            .unwrap()
            .iter()
            .map(|t| t.id.to_string())
            .collect();
        assert_eq!(got, ["L1/gelu"]);
    }
}
