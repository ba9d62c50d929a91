//! Resolving `campaign.targets` against what is really there: the default catalog, widened
//! with the configured fastkernels checkout's baselines ([`crate::harness::catalog`]) and the
//! operators the configured captures name ([`crate::captures`]); and settling the capture
//! folder itself ([`Config::settle_captures`]: as configured, or the embedded default written
//! under the home). Kept here, not in [`crate::target`] or [`crate::captures`], so that those
//! stay below the configuration.

use std::collections::BTreeSet;
use std::path::Path;

use super::{Config, ConfigError, DEFAULT_CAPTURES, SettingSource};
use crate::target::{Catalog, Target, TargetError, TargetId};

/// What a campaign's target selection is resolved against.
pub struct SelectionInputs<'a> {
    pub catalog: &'a Catalog,
    pub spec: &'a str,
    /// The configured fastkernels checkout, whose baselines widen the catalog.
    pub checkout: Option<&'a Path>,
    /// The configured capture folder (`captured`, and ids only the captures name).
    pub captures: &'a Path,
}

/// Resolves a selection. The default catalog answers a selection of its own ids; `captured`
/// or an id it lacks widens it with the checkout's baselines and the captures' operators
/// first. Returns the ids and the catalog they came from (sessions need their classes).
pub fn select_for_config(i: &SelectionInputs<'_>) -> Result<(Vec<TargetId>, Catalog), TargetError> {
    let wants_captured = i
        .spec
        .split(',')
        .any(|item| item.eq_ignore_ascii_case("captured"));
    if !wants_captured {
        match i.catalog.select(i.spec) {
            Ok(ids) => return Ok((ids, i.catalog.clone())),
            Err(TargetError::UnknownTarget { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let offered: Option<Vec<Target>> = i
        .checkout
        .and_then(|dir| crate::harness::catalog::read_checkout(dir).ok())
        .filter(|t| !t.is_empty());
    let mut wide = i.catalog.clone();
    if let Some(found) = &offered {
        wide = wide.with_targets(found.iter().cloned());
    }
    match crate::captures::reports_for(i.captures) {
        Ok(reports) => {
            let cov = crate::captures::report::coverage(&reports);
            let mut captured = crate::captures::report::captured_ids(&cov);
            // With a checkout, only what it offers can be benched there.
            if let Some(found) = &offered {
                let ids: BTreeSet<&TargetId> = found.iter().map(|t| &t.id).collect();
                captured.retain(|id| ids.contains(id));
            }
            if offered.is_none() {
                wide = wide.with_targets(crate::captures::report::targets_of(&cov));
            }
            wide = wide.with_captured(captured);
        }
        Err(why) if wants_captured => {
            return Err(TargetError::Captured {
                why: format!("cannot read campaign.captures: {why}"),
            });
        }
        Err(_) => {}
    }
    let ids = wide.select(i.spec)?;
    Ok((ids, wide))
}

impl Config {
    /// Makes `config.captures` an existing directory: as configured, or the embedded default
    /// written under the home. Records where the default came from in `config.settings`.
    pub fn settle_captures(&mut self) -> Result<(), crate::error::Error> {
        if self.captures.is_dir() {
            return Ok(());
        }
        let source = self.settings.get("campaign.captures").map(|(_, s)| *s);
        if source != Some(SettingSource::Default) {
            return Err(ConfigError::because(
                "campaign.captures",
                self.captures.display().to_string(),
                "no such directory (set it to a fastkernels capture directory, or leave it out for the shipped default)",
            )
            .into());
        }
        // The home mirrors the repository's layout, so the default's relative path works there.
        crate::captures::write_embedded(&self.home)?;
        self.captures = self.home.join(DEFAULT_CAPTURES);
        let shown = format!("{} (embedded default)", self.captures.display());
        super::record(
            &mut self.settings,
            "campaign.captures",
            shown,
            SettingSource::Default,
        );
        Ok(())
    }
}
