//! The capture directory a campaign reads shapes from, settled before anything uses it.
//!
//! Owns the shipped default captures (`captures/default/…`, embedded in the binary) and the
//! check that a configured capture directory exists. The default path is relative to a
//! fk-agentd checkout; run anywhere else, the embedded copy is written under
//! `<home>/captures/default/` and used instead, so `fk-agentd start` works from any folder.
//! A configured directory that does not exist is a usage error naming `campaign.captures`,
//! raised before a session starts (otherwise every validation would fail the same way, late).
//!
//! Invariant: an embedded file is written only when it is missing or differs, and never over a
//! directory the user configured.

use std::path::Path;

use crate::config::{Config, ConfigError, DEFAULT_CAPTURES, SettingSource};
use crate::error::Error;

/// One shipped file: its path below the repository's `captures/` (and the home's), and contents.
macro_rules! shipped {
    ($rel:literal) => {
        ($rel, include_bytes!(concat!("../captures/", $rel)) as &[u8])
    };
}

/// The shipped default captures (everything below `captures/default/`).
const EMBEDDED: &[(&str, &[u8])] = &[
    shipped!("default/b200/summary.json"),
    shipped!(
        "default/b200/09_BAAI__bge-m3_tp1_float16/report_BAAI__bge-m3_tp1_float16_single-request_req1000000_seqsauto_eager.json"
    ),
    shipped!(
        "default/h200/09_BAAI__bge-m3_tp1_float16/report_BAAI__bge-m3_tp1_float16_single-request_req1000000_seqsauto_eager.json"
    ),
];

/// Makes `config.captures` an existing directory: as configured, or the embedded default
/// written under the home. Records where the default came from in `config.settings`.
pub fn settle(config: &mut Config) -> Result<(), Error> {
    if config.captures.is_dir() {
        return Ok(());
    }
    let source = config.settings.get("campaign.captures").map(|(_, s)| *s);
    if source != Some(SettingSource::Default) {
        return Err(ConfigError::because(
            "campaign.captures",
            config.captures.display().to_string(),
            "no such directory (set it to a fastkernels capture directory, or leave it out for the shipped default)",
        )
        .into());
    }
    // The home mirrors the repository's layout, so the default's relative path works there.
    write_embedded(&config.home)?;
    config.captures = config.home.join(DEFAULT_CAPTURES);
    config.settings.insert(
        "campaign.captures".into(),
        (
            format!("{} (embedded default)", config.captures.display()),
            SettingSource::Default,
        ),
    );
    Ok(())
}

/// Writes the embedded captures below `<root>/captures/`, leaving identical files untouched.
pub fn write_embedded(root: &Path) -> Result<(), Error> {
    for (rel, bytes) in EMBEDDED {
        let path = root.join("captures").join(rel);
        if std::fs::read(&path).is_ok_and(|have| have == *bytes) {
            continue;
        }
        let io = |source| Error::Io {
            what: format!("cannot write the default captures to {}", path.display()),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(&path, bytes).map_err(io)?;
    }
    Ok(())
}
