//! The campaign's spending limits: `[campaign] max_tokens`, `max_cost_usd` (campaign-wide
//! caps the scheduler enforces) and `max_turns` (per session). File keys only: they belong
//! with the campaign they limit, not with one invocation.

use serde::Serialize;

use super::{ConfigError, SettingMap, SettingSource};

/// Turns a session may take when `max_turns` is not set.
pub const DEFAULT_MAX_TURNS: u32 = 200;

/// The validated limits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CampaignLimits {
    /// Tokens (input + output) the whole campaign may spend; `None`: no cap.
    pub max_tokens: Option<u64>,
    /// Dollars the whole campaign may spend, priced by the provider's `[prices]`.
    pub max_cost_usd: Option<f64>,
    /// Turns one session may take.
    pub max_turns: u32,
}

impl Default for CampaignLimits {
    fn default() -> Self {
        Self {
            max_tokens: None,
            max_cost_usd: None,
            max_turns: DEFAULT_MAX_TURNS,
        }
    }
}

/// The raw values as the file gave them.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawLimits {
    pub max_tokens: Option<i64>,
    pub max_cost_usd: Option<f64>,
    pub max_turns: Option<i64>,
}

/// Checks the limits and records them among the settings the manifest lists.
pub fn parse(raw: RawLimits, settings: &mut SettingMap) -> Result<CampaignLimits, ConfigError> {
    let max_tokens = match raw.max_tokens {
        Some(n) if n < 1 => {
            return Err(ConfigError::new(
                "campaign.max_tokens",
                n.to_string(),
                "a positive number of tokens",
            ));
        }
        other => other.map(|n| n as u64),
    };
    let max_cost_usd = match raw.max_cost_usd {
        Some(x) if !(x.is_finite() && x > 0.0) => {
            return Err(ConfigError::new(
                "campaign.max_cost_usd",
                x.to_string(),
                "a positive amount of US dollars such as 250.0",
            ));
        }
        other => other,
    };
    let max_turns = match raw.max_turns {
        Some(n) if !(1..=100_000).contains(&n) => {
            return Err(ConfigError::new(
                "campaign.max_turns",
                n.to_string(),
                "a number of turns from 1 to 100000",
            ));
        }
        Some(n) => n as u32,
        None => DEFAULT_MAX_TURNS,
    };
    // Only limits the file set are listed, so a manifest shows the caps a campaign ran under.
    let file = SettingSource::File;
    if let Some(n) = max_tokens {
        super::record(settings, "campaign.max_tokens", n, file);
    }
    if let Some(x) = max_cost_usd {
        super::record(settings, "campaign.max_cost_usd", x, file);
    }
    if raw.max_turns.is_some() {
        super::record(settings, "campaign.max_turns", max_turns, file);
    }
    Ok(CampaignLimits {
        max_tokens,
        max_cost_usd,
        max_turns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn limits_default_to_no_cap_and_200_turns() {
        let mut settings = SettingMap::new();
        assert_eq!(
            parse(RawLimits::default(), &mut settings).unwrap(),
            CampaignLimits::default()
        );
        assert!(settings.is_empty(), "{settings:?}");
    }

    #[test]
    fn bad_limits_name_their_key_and_value() {
        let mut settings = SettingMap::new();
        let bad = [
            (
                RawLimits {
                    max_tokens: Some(0),
                    ..RawLimits::default()
                },
                "campaign.max_tokens",
                "0",
            ),
            (
                RawLimits {
                    max_cost_usd: Some(-1.0),
                    ..RawLimits::default()
                },
                "campaign.max_cost_usd",
                "-1",
            ),
            (
                RawLimits {
                    max_turns: Some(0),
                    ..RawLimits::default()
                },
                "campaign.max_turns",
                "0",
            ),
        ];
        for (raw, key, value) in bad {
            let e = parse(raw, &mut settings).unwrap_err();
            assert_eq!((e.key.as_str(), e.value.as_str()), (key, value));
        }
    }
}
