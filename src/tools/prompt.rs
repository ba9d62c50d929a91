//! The optimize prompt: its template (`prompts/optimize.md`, embedded) and the renderer.
//!
//! Placeholders are `{{name}}` with `name` in `[a-z_]+`. Rendering is one pass (a value that
//! contains `{{…}}` is not expanded again) and strict: a placeholder without a value, a value
//! left empty, or a `{{` that opens no valid placeholder is an error, so a prompt never goes
//! out with a hole in it. The SHA-256 of the rendered text is recorded per session.

use std::collections::BTreeMap;

use crate::target::Target;

/// The optimize template, compiled in.
pub const OPTIMIZE_TEMPLATE: &str = include_str!("../../prompts/optimize.md");

/// A rendered prompt and the hex SHA-256 of its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedPrompt {
    pub text: String,
    pub sha256: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PromptError {
    #[error("prompt template line {line}: unknown placeholder `{{{{{name}}}}}`")]
    Unknown { name: String, line: usize },
    #[error("prompt placeholder `{{{{{name}}}}}` has an empty value")]
    Unfilled { name: String },
    #[error("prompt template line {line}: `{{{{` does not open a `{{{{name}}}}` placeholder")]
    Malformed { line: usize },
}

/// The facts the optimize prompt needs about one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptFacts {
    pub target: Target,
    /// The baseline as the model reaches it (`baseline/L1/gelu.py`).
    pub baseline_path: String,
    /// Where the captured workloads are.
    pub captures: String,
    /// The candidate slot as the model names it (`candidate/L1/gelu.py`).
    pub candidate_path: String,
    /// The captured shapes, already formatted (a Markdown list or a fenced block).
    pub shapes: String,
}

impl PromptFacts {
    /// The placeholder values: `target`, `level`, `classes`, `baseline_path`, `captures`,
    /// `candidate_path`, `shapes`, and `name_prefix` (for unique extension names).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let classes = self
            .target
            .classes
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ");
        [
            ("target", self.target.id.to_string()),
            ("level", self.target.id.level_dir()),
            ("classes", classes),
            ("baseline_path", self.baseline_path.clone()),
            ("captures", self.captures.clone()),
            ("candidate_path", self.candidate_path.clone()),
            ("shapes", self.shapes.clone()),
            (
                "name_prefix",
                format!("fk_l{}_{}", self.target.id.level(), self.target.id.stem()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Renders the embedded optimize template for `facts`.
pub fn render_optimize(facts: &PromptFacts) -> Result<RenderedPrompt, PromptError> {
    render(OPTIMIZE_TEMPLATE, &facts.to_map())
}

/// Fills every `{{name}}` in `template` from `facts`.
pub fn render(
    template: &str,
    facts: &BTreeMap<String, String>,
) -> Result<RenderedPrompt, PromptError> {
    let mut text = String::with_capacity(template.len() + 1024);
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let line = 1 + template[..template.len() - rest.len() + open]
            .matches('\n')
            .count();
        text.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or(PromptError::Malformed { line })?;
        let name = &after[..close];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return Err(PromptError::Malformed { line });
        }
        let value = facts.get(name).ok_or_else(|| PromptError::Unknown {
            name: name.to_string(),
            line,
        })?;
        if value.trim().is_empty() {
            return Err(PromptError::Unfilled {
                name: name.to_string(),
            });
        }
        text.push_str(value);
        rest = &after[close + 2..];
    }
    text.push_str(rest);
    let sha256 = crate::digest::sha256_hex(text.as_bytes());
    Ok(RenderedPrompt { text, sha256 })
}
