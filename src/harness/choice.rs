//! Which patch series a run applies to its private copy: `[fastkernels] patches` / `--patches`.
//!
//! `auto` (the default) applies the shipped series where it is applicable (the checkout is the
//! commit the series was written for): its paired-timing patch (0001) always, its `deep_gemm`
//! patch (0002) only where `deep_gemm` cannot be imported on this host; on another commit it
//! runs unpatched (timed as published) and says why. `shipped` insists on
//! the shipped series, `none` never patches, and a folder is the user's own series in the same
//! format ([`super::patches::PatchSeries`]).
//!
//! Owns [`PatchChoice`] (the setting), [`PatchDecision`] (what was chosen, why, recorded with
//! the copy and in the facts) and [`decide`], a pure function of the setting, the checkout's
//! commit and the host's `deep_gemm` probe, so every branch is tested without Python.
//!
//! Invariant: a refusal always names the option (`fastkernels.patches`, `--patches`) so the
//! user learns the way out.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::HarnessError;
use super::preflight::Probe;

/// The commit of Snowflake-AI-Research/fastkernels the shipped series was written for (also
/// named in `patches/fastkernels/series`).
pub const SHIPPED_BASE_COMMIT: &str = "21f84ee41ca5f495fa4b26cb74e756490a98d4fe";

/// The option as the user names it, in every message about it.
pub const OPTION: &str = "fastkernels.patches (--patches)";

/// `[fastkernels] patches`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatchChoice {
    #[default]
    Auto,
    Shipped,
    None,
    /// A folder holding a `series` file and its patches and checks.
    Dir(PathBuf),
}

impl PatchChoice {
    /// Parses the setting; a folder is made absolute against `cwd` (after `~/` expansion by
    /// the caller) and must exist.
    pub fn parse(value: &str, resolve: impl Fn(&str) -> PathBuf) -> Result<Self, String> {
        match value {
            "auto" => Ok(Self::Auto),
            "shipped" => Ok(Self::Shipped),
            "none" => Ok(Self::None),
            "" => Err("\"auto\", \"shipped\", \"none\" or a folder holding a patch series".into()),
            dir => {
                let path = resolve(dir);
                if path.join("series").is_file() {
                    Ok(Self::Dir(path))
                } else {
                    Err(format!(
                        "\"auto\", \"shipped\", \"none\" or a folder holding a `series` file ({} has none)",
                        path.display()
                    ))
                }
            }
        }
    }

    /// The setting as text (`auto`, `shipped`, `none`, or the folder).
    pub fn as_setting(&self) -> String {
        match self {
            Self::Auto => "auto".into(),
            Self::Shipped => "shipped".into(),
            Self::None => "none".into(),
            Self::Dir(d) => d.display().to_string(),
        }
    }
}

/// Which series the copy gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SeriesPick {
    /// The series shipped with (and embedded in) this binary.
    Shipped,
    /// The shipped series' paired-timing patch alone (`deep_gemm` imports on this host).
    ShippedTiming,
    /// The user's own series in this folder.
    Dir { dir: PathBuf },
    /// No patch: the copy is the checkout's commit as it is.
    Unpatched,
}

/// What was decided, and why: recorded beside the copy and in the run's facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchDecision {
    /// The setting as configured (`auto`, `shipped`, `none` or a folder).
    pub setting: String,
    pub series: SeriesPick,
    /// One sentence for the manifest.
    pub reason: String,
}

impl PatchDecision {
    /// `shipped series`, `unpatched`, `series <dir>`.
    pub fn series_words(&self) -> String {
        match &self.series {
            SeriesPick::Shipped => "shipped series".into(),
            SeriesPick::ShippedTiming => "shipped series, timing patch only".into(),
            SeriesPick::Dir { dir } => format!("series {}", dir.display()),
            SeriesPick::Unpatched => "unpatched".into(),
        }
    }
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

/// Whether [`decide`] needs the host's `deep_gemm` probe (only `auto` on the series' commit).
pub fn needs_probe(choice: &PatchChoice, commit: &str) -> bool {
    *choice == PatchChoice::Auto && commit == SHIPPED_BASE_COMMIT
}

/// Decides the series. `deep_gemm` is the host's probe, when [`needs_probe`] asked for one.
pub fn decide(
    choice: &PatchChoice,
    commit: &str,
    deep_gemm: Option<&Probe>,
) -> Result<PatchDecision, HarnessError> {
    let setting = choice.as_setting();
    let (series, reason) = match choice {
        PatchChoice::None => (
            SeriesPick::Unpatched,
            "fastkernels.patches = \"none\": the copy is the checkout's commit, unchanged".into(),
        ),
        PatchChoice::Dir(dir) => (
            SeriesPick::Dir { dir: dir.clone() },
            format!("fastkernels.patches names the series in {}", dir.display()),
        ),
        PatchChoice::Shipped if commit != SHIPPED_BASE_COMMIT => {
            return Err(HarnessError::PatchOption {
                setting,
                why: format!(
                    "the shipped series is for fastkernels {}, the checkout is at {}; use \
                     `--patches auto` or `none` to run it unpatched, or a folder of your own series",
                    short(SHIPPED_BASE_COMMIT),
                    short(commit)
                ),
            });
        }
        PatchChoice::Shipped => (
            SeriesPick::Shipped,
            "fastkernels.patches = \"shipped\"".into(),
        ),
        PatchChoice::Auto if commit != SHIPPED_BASE_COMMIT => (
            SeriesPick::Unpatched,
            format!(
                "auto: the checkout is at {}, the shipped series is for {}; running unpatched",
                short(commit),
                short(SHIPPED_BASE_COMMIT)
            ),
        ),
        PatchChoice::Auto => auto_on_series_commit(deep_gemm),
    };
    Ok(PatchDecision {
        setting,
        series,
        reason,
    })
}

/// `auto` on the series' commit: the series, or its timing patch alone where deep_gemm imports.
fn auto_on_series_commit(deep_gemm: Option<&Probe>) -> (SeriesPick, String) {
    match deep_gemm {
        Some(p) if p.found => (
            SeriesPick::ShippedTiming,
            format!(
                "auto: the checkout is the shipped series' commit; deep_gemm imports on this host ({}), so only the paired-timing patch applies",
                p.detail
            ),
        ),
        Some(p) => (
            SeriesPick::Shipped,
            format!(
                "auto: the checkout is the shipped series' commit and deep_gemm is missing here ({})",
                p.detail
            ),
        ),
        None => (
            SeriesPick::Shipped,
            "auto: the checkout is the shipped series' commit and deep_gemm was not probed".into(),
        ),
    }
}

/// What [`prepare`] needs.
pub struct PrepareParams<'a> {
    pub checkout: &'a Path,
    pub choice: &'a PatchChoice,
    pub home: &'a Path,
    /// The interpreter (`python3`) for the `deep_gemm` probe.
    pub python: &'a [String],
}

/// Decides the series, then makes (or reuses) the private copy under `<home>/harness/`, with
/// the decision recorded in it. A series that does not apply is refused naming the option.
pub async fn prepare(
    params: &PrepareParams<'_>,
) -> Result<super::patches::PreparedHarness, HarnessError> {
    use super::patches::{PatchSeries, checkout_state, copy_name, prepare_cached};
    let (commit, _) = checkout_state(params.checkout)?;
    let probe = if needs_probe(params.choice, &commit) {
        Some(super::preflight::probe_package(params.python, "deep_gemm").await)
    } else {
        None
    };
    let decision = decide(params.choice, &commit, probe.as_ref())?;
    // The shipped series is written under the home first: the binary embeds it.
    let series = match &decision.series {
        SeriesPick::Shipped => PatchSeries::load(&super::write_shipped_series(params.home)?)?,
        SeriesPick::ShippedTiming => {
            let mut series = PatchSeries::load(&super::write_shipped_series(params.home)?)?;
            series.patches.retain(|p| p.name == super::TIMING_PATCH);
            series
        }
        SeriesPick::Dir { dir } => PatchSeries::load(dir)?,
        SeriesPick::Unpatched => PatchSeries::default(),
    };
    let dest = params
        .home
        .join("harness")
        .join(copy_name(&commit, &series));
    let checkout = params.checkout.to_path_buf();
    let setting = decision.setting.clone();
    let mut prepared = tokio::task::spawn_blocking(move || {
        prepare_cached(&checkout, &series, &dest)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
    .map_err(HarnessError::io("prepare the private copy"))?
    .map_err(|e| match e {
        e @ (HarnessError::DoesNotApply { .. } | HarnessError::CheckFailed { .. }) => {
            HarnessError::PatchOption {
                setting,
                why: format!(
                    "{e}; `--patches none` runs the checkout unpatched, `auto` patches only \
                         commit {}",
                    short(SHIPPED_BASE_COMMIT)
                ),
            }
        }
        other => other,
    })?;
    prepared.decision = Some(decision);
    Ok(prepared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::preflight::tests::probe;

    #[test]
    fn auto_patches_only_the_series_commit_on_a_host_without_deep_gemm() {
        let other = "0123456789abcdef0123456789abcdef01234567";
        let at = |c, p: Option<&Probe>| decide(&PatchChoice::Auto, c, p).unwrap().series;
        assert_eq!(
            at(SHIPPED_BASE_COMMIT, Some(&probe("deep_gemm", false))),
            SeriesPick::Shipped
        );
        assert_eq!(
            at(SHIPPED_BASE_COMMIT, Some(&probe("deep_gemm", true))),
            SeriesPick::ShippedTiming
        );
        assert_eq!(at(other, None), SeriesPick::Unpatched);
        assert!(needs_probe(&PatchChoice::Auto, SHIPPED_BASE_COMMIT));
        assert!(!needs_probe(&PatchChoice::Auto, other));
        assert!(!needs_probe(&PatchChoice::Shipped, SHIPPED_BASE_COMMIT));
    }

    #[test]
    fn shipped_refuses_another_commit_naming_the_option() {
        let err = decide(&PatchChoice::Shipped, "abc", None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("fastkernels.patches (--patches) = \"shipped\""),
            "{text}"
        );
        assert!(text.contains("--patches auto"), "{text}");
        assert_eq!(err.exit_code(), crate::exit::EXIT_USAGE);
    }

    #[test]
    fn the_setting_parses_words_and_folders_with_a_series() {
        let tmp = tempfile::tempdir().unwrap();
        let at = |s: &str| tmp.path().join(s);
        assert_eq!(PatchChoice::parse("auto", at), Ok(PatchChoice::Auto));
        assert_eq!(PatchChoice::parse("none", at), Ok(PatchChoice::None));
        assert!(
            PatchChoice::parse("mine", at)
                .unwrap_err()
                .contains("series")
        );
        std::fs::create_dir_all(at("mine")).unwrap();
        std::fs::write(at("mine/series"), "").unwrap();
        assert_eq!(
            PatchChoice::parse("mine", at),
            Ok(PatchChoice::Dir(at("mine")))
        );
    }

    #[test]
    fn the_base_commit_is_the_one_the_shipped_series_names() {
        let series = super::super::SHIPPED_SERIES[0].1;
        assert!(series.contains(SHIPPED_BASE_COMMIT));
    }
}
