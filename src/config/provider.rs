//! Provider files (`provider-config/<name>.toml`): where the Responses endpoint is, which model
//! at which reasoning effort, where the token comes from, extra headers, limits and prices.
//!
//! A provider is chosen by name (looked up in `<home>/provider-config/`, then the files shipped
//! with fk-agentd) or by a path to a TOML file. The token itself is never read here: this
//! module only says where it lives ([`TokenSource`]); `llm` reads it when needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Env, expand_tilde, parse_duration};

/// Provider files shipped with fk-agentd, usable by name anywhere.
pub const SHIPPED: &[(&str, &str)] = &[
    ("cortex", include_str!("../../provider-config/cortex.toml")),
    ("openai", include_str!("../../provider-config/openai.toml")),
];

/// Reasoning effort sent as `reasoning.effort` (never as a suffix of the model id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

crate::words!(serde ReasoningEffort {
    None = "none",
    Minimal = "minimal",
    Low = "low",
    Medium = "medium",
    High = "high",
    Xhigh = "xhigh",
});

/// Where the provider token is read from. Holds no secret itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TokenSource {
    /// A file re-read before every session and after every 401.
    File { path: PathBuf },
    /// An environment variable (read by the token source, at the edge).
    Env { var: String },
    /// A command whose trimmed stdout is the token, cached for `refresh`.
    Command {
        argv: Vec<String>,
        #[serde(serialize_with = "super::ser_duration")]
        refresh: Duration,
    },
    /// A literal token handed in by the embedded simulation only; never from a file.
    Sim,
}

/// What holds a provider's token, kept from every child fk-agentd starts: the variable is
/// removed from their environments, the file hidden from agent code ([`crate::confine`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderSecrets {
    pub var: Option<String>,
    pub file: Option<PathBuf>,
}

/// Request-rate, retry and window limits of one provider.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Limits {
    pub requests_per_minute: u32,
    pub tokens_per_minute: u32,
    pub max_retries: u32,
    #[serde(serialize_with = "super::ser_duration")]
    pub stream_idle_timeout: Duration,
    pub context_window: u64,
}

/// USD per million tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    pub input: f64,
    pub cached_input: Option<f64>,
    pub output: f64,
}

/// A validated provider.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProviderConfig {
    pub name: String,
    /// Where it was read from (`shipped:cortex` or a file path).
    pub origin: String,
    pub base_url: String,
    pub model: String,
    pub reasoning_effort: ReasoningEffort,
    pub reasoning_summary: String,
    pub token: TokenSource,
    pub headers: BTreeMap<String, String>,
    pub limits: Limits,
    pub prices: Option<Prices>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    name: Option<String>,
    base_url: String,
    account: Option<String>,
    model: String,
    reasoning_effort: Option<String>,
    reasoning_summary: Option<String>,
    token_file: Option<String>,
    token_env: Option<String>,
    token_command: Option<Vec<String>>,
    token_command_refresh: Option<String>,
    tools: Option<Vec<String>>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    limits: RawLimits,
    prices: Option<Prices>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u32>,
    max_retries: Option<u32>,
    stream_idle_timeout: Option<String>,
    context_window: Option<u64>,
}

impl ProviderConfig {
    /// Loads a provider by name or path. A name is looked up in `<home>/provider-config/`
    /// first, then among the shipped files.
    pub fn load(choice: &str, home: &Path, env: &Env) -> Result<Self, ConfigError> {
        let (name, origin, text) = Self::locate(choice, home, env)?;
        Self::parse(&name, &origin, &text, env)
    }

    /// Where a provider keeps its token (the variable, the file), read without validating the
    /// rest: what children must never get (see [`ProviderSecrets`]).
    pub fn secrets_of(choice: &str, home: &Path, env: &Env) -> ProviderSecrets {
        let table: Option<toml::Table> = Self::locate(choice, home, env)
            .ok()
            .and_then(|(_, _, text)| toml::from_str(&text).ok());
        let text = |k: &str| {
            table
                .as_ref()
                .and_then(|t| t.get(k)?.as_str().map(str::to_string))
        };
        ProviderSecrets {
            var: text("token_env"),
            file: text("token_file").map(|f| expand_tilde(&f, env)),
        }
    }

    /// Fails as [`ProviderConfig::load`] would when no provider `choice` names can be found
    /// (the simulation uses none, but a provider named on its command line must exist).
    pub fn check_exists(choice: &str, home: &Path, env: &Env) -> Result<(), ConfigError> {
        Self::locate(choice, home, env).map(drop)
    }

    /// `(name, origin, text)` of a provider chosen by name or path.
    fn locate(
        choice: &str,
        home: &Path,
        env: &Env,
    ) -> Result<(String, String, String), ConfigError> {
        let looks_like_path = choice.contains('/') || choice.ends_with(".toml");
        Ok(if looks_like_path {
            let path = super::absolute(&env.cwd, Path::new(choice));
            let text = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError::new(
                    "provider.use (--provider)",
                    choice,
                    format!("a readable provider TOML file ({e})"),
                )
            })?;
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("provider")
                .to_string();
            (stem, path.display().to_string(), text)
        } else {
            let local = home.join("provider-config").join(format!("{choice}.toml"));
            if local.is_file() {
                let text = std::fs::read_to_string(&local).map_err(|e| {
                    ConfigError::new(
                        "provider.use (--provider)",
                        local.display().to_string(),
                        format!("a readable file ({e})"),
                    )
                })?;
                (choice.to_string(), local.display().to_string(), text)
            } else if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == choice) {
                (
                    choice.to_string(),
                    format!("shipped:{choice}"),
                    text.to_string(),
                )
            } else {
                let known: Vec<&str> = SHIPPED.iter().map(|(n, _)| *n).collect();
                return Err(ConfigError::new(
                    "provider.use (--provider)",
                    choice,
                    format!(
                        "a provider name ({}, or a file in {}) or a path to a provider TOML",
                        known.join(", "),
                        home.join("provider-config").display()
                    ),
                ));
            }
        })
    }

    /// Parses and validates provider TOML text.
    pub fn parse(name: &str, origin: &str, text: &str, env: &Env) -> Result<Self, ConfigError> {
        // A type error names the file, the line and its text (which holds the key).
        let raw: RawProvider =
            toml::from_str(text).map_err(|e| super::toml_error(Path::new(origin), text, &e))?;
        let key = |k: &str| format!("provider {name}: {k}");
        let model = validate_model(&key("model"), &raw.model)?;
        let base_url =
            resolve_base_url(&key("base_url"), &raw.base_url, raw.account.as_deref(), env)?;
        let reasoning_effort = super::word::<ReasoningEffort>(
            &key("reasoning_effort"),
            raw.reasoning_effort.as_deref().unwrap_or("high"),
        )?;
        let reasoning_summary = raw.reasoning_summary.unwrap_or_else(|| "auto".into());
        if !["auto", "concise", "detailed"].contains(&reasoning_summary.as_str()) {
            return Err(ConfigError::new(
                key("reasoning_summary"),
                reasoning_summary,
                "auto, concise or detailed",
            ));
        }
        check_tools(&key, raw.tools.as_deref().unwrap_or_default())?;
        let token = token_source(
            &key,
            raw.token_file,
            raw.token_env,
            raw.token_command,
            raw.token_command_refresh,
            env,
        )?;
        check_headers(&key, &raw.headers)?;
        let limits = validate_limits(&key, raw.limits)?;
        check_prices(&key, raw.prices.as_ref())?;
        Ok(Self {
            name: raw.name.unwrap_or_else(|| name.to_string()),
            origin: origin.to_string(),
            base_url,
            model,
            reasoning_effort,
            reasoning_summary,
            token,
            headers: raw.headers,
            limits,
            prices: raw.prices,
        })
    }
}

/// Rejects model ids that smuggle the effort in (`name:high`), which Cortex answers with
/// `unknown model`.
pub fn validate_model(key: &str, model: &str) -> Result<String, ConfigError> {
    let model = model.trim();
    if model.is_empty() {
        return Err(ConfigError::new(
            key,
            model,
            "a model id such as openai-gpt-5.6-sol",
        ));
    }
    if let Some((base, suffix)) = model.split_once(':') {
        return Err(ConfigError::new(
            key,
            model,
            format!(
                "a plain model id without `:`; write model = \"{base}\" and reasoning_effort = \"{suffix}\" \
                 (Cortex answers `unknown model` to `name:effort`)"
            ),
        ));
    }
    if model.chars().any(char::is_whitespace) {
        return Err(ConfigError::new(key, model, "a model id without spaces"));
    }
    Ok(model.to_string())
}

fn resolve_base_url(
    key: &str,
    template: &str,
    account: Option<&str>,
    env: &Env,
) -> Result<String, ConfigError> {
    let mut url = template.trim().trim_end_matches('/').to_string();
    if url.contains("{account}") {
        let account = account
            .map(str::to_string)
            .or_else(|| env.snowflake_account.clone())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                ConfigError::new(
                    key,
                    template,
                    "an account for {account}: set `account = \"org-acct\"` in the provider file or SNOWFLAKE_ACCOUNT",
                )
            })?;
        if !account
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(ConfigError::new(
                "account",
                account,
                "a Snowflake account identifier ([A-Za-z0-9._-])",
            ));
        }
        url = url.replace("{account}", &account.to_ascii_lowercase());
    }
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(ConfigError::new(key, template, "an http(s) URL"));
    }
    match reqwest::Url::parse(&url) {
        Ok(u) if u.host().is_some() => Ok(url),
        Ok(_) => Err(ConfigError::new(
            key,
            template,
            "an http(s) URL with a host",
        )),
        Err(e) => Err(ConfigError::new(
            key,
            template,
            format!("a valid http(s) URL ({e})"),
        )),
    }
}

fn token_source(
    key: &dyn Fn(&str) -> String,
    file: Option<String>,
    var: Option<String>,
    command: Option<Vec<String>>,
    refresh: Option<String>,
    env: &Env,
) -> Result<TokenSource, ConfigError> {
    let given = [file.is_some(), var.is_some(), command.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if given != 1 {
        return Err(ConfigError::new(
            key("token_file/token_env/token_command"),
            format!("{given} given"),
            "exactly one of token_file, token_env, token_command",
        ));
    }
    if let Some(f) = file {
        if f.trim().is_empty() {
            return Err(ConfigError::new(
                key("token_file"),
                f,
                "the path of the file holding the token",
            ));
        }
        return Ok(TokenSource::File {
            path: expand_tilde(&f, env),
        });
    }
    if let Some(v) = var {
        if v.trim().is_empty() {
            return Err(ConfigError::new(
                key("token_env"),
                v,
                "the name of the variable holding the token",
            ));
        }
        return Ok(TokenSource::Env { var: v });
    }
    let argv = command.unwrap_or_default();
    if argv.is_empty() || argv[0].is_empty() {
        return Err(ConfigError::new(
            key("token_command"),
            "[]",
            "a command argv such as [\"pat\", \"print\"]",
        ));
    }
    let refresh = refresh.map_or(Ok(Duration::from_secs(300)), |r| {
        parse_duration(&key("token_command_refresh"), &r, super::bounds::WAIT)
    })?;
    Ok(TokenSource::Command { argv, refresh })
}

/// Refuses any tool type but `function` (the only one when none is listed).
fn check_tools(key: &dyn Fn(&str) -> String, tools: &[String]) -> Result<(), ConfigError> {
    for tool in tools {
        if tool != "function" {
            return Err(ConfigError::new(
                key("tools"),
                tool,
                "only \"function\": Cortex rejects hosted tools such as web_search",
            ));
        }
    }
    Ok(())
}

/// Refuses header names or values HTTP cannot carry, and any `Authorization` header.
fn check_headers(
    key: &dyn Fn(&str) -> String,
    headers: &BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    for (h, v) in headers {
        let bad_name = h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if bad_name || v.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err(ConfigError::new(
                key("headers"),
                h,
                "HTTP header names and printable values",
            ));
        }
        if h.eq_ignore_ascii_case("authorization") {
            return Err(ConfigError::new(
                key("headers"),
                h,
                "no Authorization header: the token comes from token_file/token_env/token_command",
            ));
        }
    }
    Ok(())
}

/// Refuses a price that is negative or not a finite number.
fn check_prices(key: &dyn Fn(&str) -> String, prices: Option<&Prices>) -> Result<(), ConfigError> {
    if let Some(p) = prices {
        let each = [
            ("prices.input", Some(p.input)),
            ("prices.cached_input", p.cached_input),
            ("prices.output", Some(p.output)),
        ];
        for (k, v) in each {
            if let Some(v) = v.filter(|v| !v.is_finite() || *v < 0.0) {
                return Err(ConfigError::new(
                    key(k),
                    v.to_string(),
                    "a price in USD per million tokens, 0 or more",
                ));
            }
        }
    }
    Ok(())
}

fn validate_limits(key: &dyn Fn(&str) -> String, raw: RawLimits) -> Result<Limits, ConfigError> {
    let positive = |k: &str, v: Option<u32>, default: u32| match v {
        Some(0) => Err(ConfigError::new(
            key(&format!("limits.{k}")),
            "0",
            "a positive integer",
        )),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let window = raw.context_window.unwrap_or(400_000);
    if window < 8_192 {
        return Err(ConfigError::new(
            key("limits.context_window"),
            window.to_string(),
            "at least 8192 tokens",
        ));
    }
    Ok(Limits {
        requests_per_minute: positive("requests_per_minute", raw.requests_per_minute, 300)?,
        tokens_per_minute: positive("tokens_per_minute", raw.tokens_per_minute, 2_000_000)?,
        max_retries: raw.max_retries.unwrap_or(5).min(100),
        stream_idle_timeout: parse_duration(
            &key("limits.stream_idle_timeout"),
            raw.stream_idle_timeout.as_deref().unwrap_or("300s"),
            super::bounds::WAIT,
        )?,
        context_window: window,
    })
}
