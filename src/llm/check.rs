//! `fk-agentd provider check`: one tiny request to the configured endpoint, and a diagnosis a
//! person can act on (expired token, network policy, wrong URL, unknown model). Builds a
//! [`CheckReport`]; [`render`] turns it into text for the CLI, which prints it.

use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{LlmClient, LlmError, TokenProvider, TokenStatus, TurnRequest, Usage, user_message};
use crate::config::provider::ProviderConfig;
use crate::exit::{EXIT_UNAVAILABLE, EXIT_USAGE};

/// What the check found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckReport {
    pub provider: String,
    pub origin: String,
    pub url: String,
    pub model: String,
    pub effort: String,
    /// Where the token came from and its age; `None` when it could not be read.
    pub token_source: String,
    pub token: Option<TokenStatus>,
    pub latency: Duration,
    pub outcome: CheckOutcome,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum CheckOutcome {
    Ok {
        response_id: String,
        usage: Usage,
        reply: String,
    },
    Failed {
        error: String,
        diagnosis: String,
        exit_code: i32,
    },
}

impl CheckReport {
    /// 0 ok, 2 bad configuration, 3 endpoint down or token refused.
    pub fn exit_code(&self) -> i32 {
        match &self.outcome {
            CheckOutcome::Ok { .. } => 0,
            CheckOutcome::Failed { exit_code, .. } => *exit_code,
        }
    }
}

/// Sends one tiny request (no retries beyond the 401 re-read) and diagnoses the outcome.
pub async fn check(
    mut provider: ProviderConfig,
    token: TokenProvider,
    cancel: &CancellationToken,
) -> CheckReport {
    provider.limits.max_retries = 0;
    let mut report = CheckReport {
        provider: provider.name.clone(),
        origin: provider.origin.clone(),
        url: format!("{}/responses", provider.base_url.trim_end_matches('/')),
        model: provider.model.clone(),
        effort: provider.reasoning_effort.to_string(),
        token_source: token.describe(),
        token: None,
        latency: Duration::ZERO,
        outcome: CheckOutcome::Ok {
            response_id: String::new(),
            usage: Usage::default(),
            reply: String::new(),
        },
    };
    let started = std::time::Instant::now();
    let result = probe(provider, token, cancel, &mut report).await;
    report.latency = started.elapsed();
    report.outcome = result.unwrap_or_else(|e| diagnose(&report, e));
    report
}

async fn probe(
    provider: ProviderConfig,
    token: TokenProvider,
    cancel: &CancellationToken,
    report: &mut CheckReport,
) -> Result<CheckOutcome, LlmError> {
    let client = LlmClient::new(provider, token)?;
    report.token = Some(client.refresh_token().await?);
    let req = TurnRequest {
        instructions: "This is a connectivity check. Reply with the single word OK.".into(),
        input: vec![user_message("ping")],
        ..TurnRequest::default()
    };
    // Only retries and token reloads arrive here; nobody needs them.
    let (tx, _rx) = tokio::sync::mpsc::channel(64);
    let done = client.turn(&req, &tx, cancel).await?;
    report.token = client.token().status().or(report.token.take());
    let mut reply = super::items::output_text(&done.output);
    if reply.chars().count() > 80 {
        reply = reply.chars().take(80).collect::<String>() + "…";
    }
    Ok(CheckOutcome::Ok {
        response_id: done.response_id,
        usage: done.usage,
        reply,
    })
}

fn diagnose(report: &CheckReport, err: LlmError) -> CheckOutcome {
    let error = err.to_string();
    let err = match err {
        LlmError::RetriesExhausted { last, .. } => *last,
        e => e,
    };
    let (diagnosis, exit_code) = match &err {
        LlmError::Config { .. } => (
            "the provider settings are invalid; fix the field named above".to_string(),
            EXIT_USAGE,
        ),
        LlmError::Token { .. } => (
            format!("the token could not be read: fix {}", report.token_source),
            EXIT_USAGE,
        ),
        LlmError::Unauthorized { status: 403, .. } => (
            "permission denied (403): the token was accepted as a credential but is not allowed \
             here; check the Snowflake network policy (a PAT only works from allowed networks), \
             the role's Cortex grants, and the account region"
                .to_string(),
            EXIT_UNAVAILABLE,
        ),
        LlmError::Unauthorized { .. } => (
            format!(
                "the endpoint refused the token (401) even after reading it again: it is expired, \
                 revoked or for another account; put a fresh token in {}",
                report.token_source
            ),
            EXIT_UNAVAILABLE,
        ),
        _ => answered(report, &err),
    };
    CheckOutcome::Failed {
        error,
        diagnosis,
        exit_code,
    }
}

/// The diagnosis and exit code of what the endpoint answered (or its silence), refusals aside.
fn answered(report: &CheckReport, err: &LlmError) -> (String, i32) {
    match err {
        LlmError::Fatal { status: 404, .. } => (
            format!(
                "not found (404): check base_url (requests go to {}; for Cortex it ends in \
                 /api/v2/cortex/v1) and that model `{}` exists",
                report.url, report.model
            ),
            EXIT_USAGE,
        ),
        LlmError::Fatal {
            status: 400,
            message,
        } if message.to_ascii_lowercase().contains("model") => (
            format!(
                "the endpoint does not accept model `{}`: use an exact id from \
                     GET /api/v2/cortex/models, without an `:effort` suffix",
                report.model
            ),
            EXIT_USAGE,
        ),
        LlmError::Fatal { .. } => (
            "the endpoint rejected the request; its message is above".to_string(),
            EXIT_UNAVAILABLE,
        ),
        LlmError::QuotaExceeded { .. } => {
            ("the account is out of quota".to_string(), EXIT_UNAVAILABLE)
        }
        LlmError::RateLimited { .. } => (
            "rate limited right now; the endpoint and token work, try again later".to_string(),
            EXIT_UNAVAILABLE,
        ),
        _ => (
            format!("the endpoint at {} is unreachable or failing", report.url),
            EXIT_UNAVAILABLE,
        ),
    }
}

/// The report as text for a person.
pub fn render(r: &CheckReport) -> String {
    let token = match r.token.as_ref().map(|t| t.age) {
        Some(Some(age)) => format!("{}, {} old", r.token_source, short(age)),
        Some(None) => r.token_source.clone(),
        None => format!("{} (not read)", r.token_source),
    };
    let mut out = format!(
        "provider  {} ({})\nendpoint  {}\nmodel     {} (reasoning {})\ntoken     {}\n",
        r.provider, r.origin, r.url, r.model, r.effort, token
    );
    match &r.outcome {
        CheckOutcome::Ok {
            response_id,
            usage,
            reply,
        } => out.push_str(&format!(
            "result    OK in {}: {} ({} input, {} output tokens), reply {:?}\n",
            short_ms(r.latency),
            response_id,
            usage.input_tokens,
            usage.output_tokens,
            reply
        )),
        CheckOutcome::Failed {
            error, diagnosis, ..
        } => out.push_str(&format!(
            "result    FAILED after {}: {}\ndiagnosis {}\n",
            short_ms(r.latency),
            error,
            diagnosis
        )),
    }
    out
}

fn short(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn short_ms(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}
