//! Targets: which fastkernels operators a campaign works on.
//!
//! Owns [`TargetId`] (`L1/rms_norm`), the [`Catalog`] of known targets (the default list of
//! 133 L1–L3 targets ships in `captures/targets_default.txt` and is embedded in the binary) and
//! the parsing of target selections (`L1-L3`, `L2`, `L1,L3`, `L2/ada_layer_norm,L1/gelu`, `all`,
//! `captured`).
//!
//! The catalog can be widened ([`Catalog::with_targets`], [`Catalog::with_captured`]; the
//! configuration does it, `crate::config::selection`) with what a fastkernels checkout offers
//! (its `tasks/baseline/L<n>/*.py`) and what the configured captures name. Widened ids are selectable by id and by `captured` (the
//! targets with at least one forward case in the captures); levels and `all` keep meaning the
//! default list, so the default selection stays the 133 ids.
//!
//! Invariants: a stem is `[a-z0-9_]+` (it becomes a path component, so nothing else gets in);
//! a selection is deduplicated and ordered by level, then stem; an unknown id or level is an
//! error that names the nearest valid ones.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The embedded default target list (level, stem, baseline classes).
pub const DEFAULT_TARGETS: &str = include_str!("../captures/targets_default.txt");

/// Errors in a target id or a target selection. Always bad input (exit 2).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("invalid target `{value}`: {why}")]
    Malformed { value: String, why: String },
    #[error("unknown level in `{value}`: the catalog has levels {known}")]
    UnknownLevel { value: String, known: String },
    #[error("unknown target `{value}`{}", suggest(.nearest))]
    UnknownTarget { value: String, nearest: Vec<String> },
    #[error("empty target selection: give e.g. `L1-L3`, `L2`, `L1/gelu` or `all`")]
    Empty,
    #[error("target list line {line}: {why}")]
    Catalog { line: usize, why: String },
    /// `captured` with captures that could not be read, or hold no forward case.
    #[error("`captured`: {why}")]
    Captured { why: String },
}

impl TargetError {
    fn malformed(value: impl Into<String>, why: impl Into<String>) -> Self {
        let (value, why) = (value.into(), why.into());
        Self::Malformed { value, why }
    }
}

fn suggest(nearest: &[String]) -> String {
    if nearest.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", nearest.join(", "))
    }
}

/// One fastkernels target: a level (1–4) and a baseline module stem.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TargetId {
    level: u8,
    stem: String,
}

impl TargetId {
    pub fn new(level: u8, stem: &str) -> Result<Self, TargetError> {
        let malformed = |why: String| Err(TargetError::malformed(format!("L{level}/{stem}"), why));
        if !(1..=4).contains(&level) {
            return malformed("the level must be 1 to 4".into());
        }
        if stem.is_empty() || stem.len() > 96 {
            return malformed("the stem must be 1 to 96 characters".into());
        }
        if let Some(bad) = stem
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
        {
            return malformed(format!(
                "character {bad:?} is not allowed (stems are [a-z0-9_], they become paths)"
            ));
        }
        Ok(Self {
            level,
            stem: stem.to_string(),
        })
    }

    pub fn level(&self) -> u8 {
        self.level
    }

    pub fn stem(&self) -> &str {
        &self.stem
    }

    /// The relative path of this target's candidate file: `L<n>/<stem>.py`.
    pub fn candidate_path(&self) -> String {
        format!("{}/{}", self.level_dir(), self.file_name())
    }

    /// The folder of this target's level in the task tree: `L<n>`.
    pub fn level_dir(&self) -> String {
        format!("L{}", self.level)
    }

    /// The name of this target's module file: `<stem>.py`.
    pub fn file_name(&self) -> String {
        format!("{}.py", self.stem)
    }

    /// A folder name for this target's files among others': `L<n>_<stem>`.
    pub fn slug(&self) -> String {
        format!("L{}_{}", self.level, self.stem)
    }
}

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}/{}", self.level, self.stem)
    }
}

impl FromStr for TargetId {
    type Err = TargetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = |why: &str| TargetError::malformed(s, why);
        let (level, stem) = s
            .split_once('/')
            .ok_or_else(|| malformed("expected `L<level>/<stem>`, e.g. `L1/gelu`"))?;
        let level =
            parse_level(level).ok_or_else(|| malformed("the level must be `L1` to `L4`"))?;
        TargetId::new(level, stem)
    }
}

impl TryFrom<String> for TargetId {
    type Error = TargetError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<TargetId> for String {
    fn from(t: TargetId) -> String {
        t.to_string()
    }
}

fn parse_level(s: &str) -> Option<u8> {
    let digits = s.strip_prefix('L').or_else(|| s.strip_prefix('l'))?;
    let n: u8 = digits.parse().ok()?;
    (1..=4).contains(&n).then_some(n)
}

/// A known target with its baseline class names (the first is the primary class).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub id: TargetId,
    pub classes: Vec<String>,
}

/// Every target a campaign may select, ordered by level then stem.
#[derive(Clone, Debug)]
pub struct Catalog {
    targets: Vec<Target>,
    /// Ids beyond the default list (from a checkout or the captures): selectable by id and
    /// `captured` only.
    extra: BTreeSet<TargetId>,
    /// The targets with a forward case in the configured captures, once read.
    captured: Option<BTreeSet<TargetId>>,
}

impl Catalog {
    /// The default 133-target list compiled into the binary.
    pub fn embedded() -> Self {
        Self::parse(DEFAULT_TARGETS).expect("the embedded target list is valid")
    }

    /// Parses `level stem Class [Class…]` lines; `#` starts a comment.
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        let mut targets = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let catalog_err = |why: String| TargetError::Catalog { line: i + 1, why };
            let mut words = line.split_whitespace();
            let level: u8 = words
                .next()
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| catalog_err("expected a level number first".into()))?;
            let stem = words
                .next()
                .ok_or_else(|| catalog_err("expected a stem after the level".into()))?;
            let id = TargetId::new(level, stem).map_err(|e| catalog_err(e.to_string()))?;
            let classes: Vec<String> = words.map(str::to_string).collect();
            if classes.is_empty() {
                return Err(catalog_err(format!("{id} lists no baseline class")));
            }
            targets.push(Target { id, classes });
        }
        targets.sort_by(|a, b| a.id.cmp(&b.id));
        targets.dedup_by(|a, b| a.id == b.id);
        Ok(Self {
            targets,
            extra: BTreeSet::new(),
            captured: None,
        })
    }

    /// This catalog plus `more` (an id already known keeps its entry); the new ids are extras.
    pub fn with_targets(mut self, more: impl IntoIterator<Item = Target>) -> Self {
        for t in more {
            if self.get(&t.id).is_none() && !t.classes.is_empty() {
                self.extra.insert(t.id.clone());
                self.targets.push(t);
            }
        }
        self.targets.sort_by(|a, b| a.id.cmp(&b.id));
        self
    }

    /// Records which targets have a forward case in the captures (for `captured`).
    pub fn with_captured(mut self, ids: BTreeSet<TargetId>) -> Self {
        self.captured = Some(ids);
        self
    }

    /// Whether `id` is one of the default list (not an extra).
    pub fn is_default(&self, id: &TargetId) -> bool {
        self.get(id).is_some() && !self.extra.contains(id)
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    pub fn get(&self, id: &TargetId) -> Option<&Target> {
        self.targets
            .binary_search_by(|t| t.id.cmp(id))
            .ok()
            .map(|i| &self.targets[i])
    }

    fn defaults(&self) -> impl Iterator<Item = &Target> {
        self.targets.iter().filter(|t| !self.extra.contains(&t.id))
    }

    fn levels(&self) -> Vec<u8> {
        let mut levels: Vec<u8> = self.defaults().map(|t| t.id.level).collect();
        levels.dedup();
        levels
    }

    /// Resolves a selection such as `L1-L3`, `L2`, `L1,L3`, `L2/ada_layer_norm,L1/gelu` or `all`.
    pub fn select(&self, spec: &str) -> Result<Vec<TargetId>, TargetError> {
        if spec.trim().is_empty() {
            return Err(TargetError::Empty);
        }
        // A stray space or an empty item is more often a shell-quoting slip than intent, and
        // quietly dropping it would start a campaign over a selection nobody wrote.
        if spec.chars().any(char::is_whitespace) {
            let why = "whitespace is not allowed in a target selection (write `L1,L2/gelu`)";
            return Err(TargetError::malformed(spec, why));
        }
        let items: Vec<&str> = spec.split(',').collect();
        if items.iter().any(|s| s.is_empty()) {
            return Err(TargetError::malformed(spec, "an empty item between commas"));
        }
        let mut out = Vec::new();
        for item in items {
            out.extend(self.select_item(item)?);
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn select_item(&self, item: &str) -> Result<Vec<TargetId>, TargetError> {
        if item.eq_ignore_ascii_case("all") {
            return Ok(self.defaults().map(|t| t.id.clone()).collect());
        }
        if item.eq_ignore_ascii_case("captured") {
            return match &self.captured {
                Some(ids) if !ids.is_empty() => Ok(ids.iter().cloned().collect()),
                Some(_) => Err(TargetError::Captured {
                    why: "no target has a forward case in the configured captures".into(),
                }),
                None => Err(TargetError::Captured {
                    why: "the captures were not read".into(),
                }),
            };
        }
        if item.contains('/') {
            let id: TargetId = item.parse()?;
            return match self.get(&id) {
                Some(_) => Ok(vec![id]),
                None => Err(self.unknown(item)),
            };
        }
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => {
                let b = if b.starts_with(['L', 'l']) {
                    b.to_string()
                } else {
                    format!("L{b}")
                };
                (self.level_of(item, a)?, self.level_of(item, &b)?)
            }
            None => {
                let l = self.level_of(item, item)?;
                (l, l)
            }
        };
        if lo > hi {
            let why = format!("the range runs backwards; did you mean `L{hi}-L{lo}`?");
            return Err(TargetError::malformed(item, why));
        }
        Ok(self
            .defaults()
            .filter(|t| (lo..=hi).contains(&t.id.level))
            .map(|t| t.id.clone())
            .collect())
    }

    fn level_of(&self, item: &str, word: &str) -> Result<u8, TargetError> {
        let known = self.levels();
        let known_text = known
            .iter()
            .map(|l| format!("L{l}"))
            .collect::<Vec<_>>()
            .join(", ");
        let is_level_word = word.len() >= 2
            && word.starts_with(['L', 'l'])
            && word[1..].chars().all(|c| c.is_ascii_digit());
        if !is_level_word {
            return Err(self.unknown(item));
        }
        match word[1..].parse::<u8>() {
            Ok(n) if known.contains(&n) => Ok(n),
            _ => Err(TargetError::UnknownLevel {
                value: item.to_string(),
                known: known_text,
            }),
        }
    }

    /// `item` names no known target: the error, with the nearest ids.
    fn unknown(&self, item: &str) -> TargetError {
        TargetError::UnknownTarget {
            value: item.to_string(),
            nearest: self.nearest(item),
        }
    }

    /// Up to three known ids closest to `value` (by stem similarity).
    fn nearest(&self, value: &str) -> Vec<String> {
        let wanted_stem = value
            .rsplit('/')
            .next()
            .unwrap_or(value)
            .to_ascii_lowercase();
        let mut scored: Vec<(f64, String)> = self
            .targets
            .iter()
            .map(|t| {
                let mut score = strsim::jaro_winkler(&wanted_stem, &t.id.stem);
                if t.id.stem.contains(&wanted_stem) && wanted_stem.len() >= 3 {
                    score += 0.2;
                }
                (score, t.id.to_string())
            })
            .filter(|(s, _)| *s >= 0.75)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        scored.into_iter().take(3).map(|(_, id)| id).collect()
    }
}

crate::exit_code!(TargetError, |self| crate::exit::EXIT_USAGE);
