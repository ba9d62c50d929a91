//! [`LlmClient`]: one per provider, shared by all sessions. A turn is a loop of attempts:
//! pace (429 gate, RPM, TPM) → send → read the stream; a 401 re-reads the token and tries
//! once more; retryable failures back off and retry up to `limits.max_retries` times, each
//! retry reported as an [`LlmEvent::Retry`].

use std::time::{Duration, SystemTime};

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;

use super::error::{classify_status, parse_error_body};
use super::limit::Pacer;
use super::retry::{backoff_delay, parse_retry_after};
use super::sse::read_events;
use super::{LlmError, LlmEvent, TokenProvider, TokenStatus, TurnRequest, TurnResponse};
use crate::config::provider::{ProviderConfig, validate_model};

/// How long to wait for a TCP/TLS connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The Responses client of one provider.
pub struct LlmClient {
    provider: ProviderConfig,
    url: String,
    http: reqwest::Client,
    token: TokenProvider,
    headers: HeaderMap,
    pacer: Pacer,
}

impl std::fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmClient")
            .field("provider", &self.provider.name)
            .field("url", &self.url)
            .field("token", &self.token)
            .finish()
    }
}

impl LlmClient {
    /// Validates the provider (a model id with `:` is refused here, before anything is sent)
    /// and builds the HTTP client.
    pub fn new(provider: ProviderConfig, token: TokenProvider) -> Result<Self, LlmError> {
        let invalid = |field: &str, value: String, reason: String| LlmError::Config {
            field: format!("provider {}: {field}", provider.name),
            value,
            reason,
        };
        validate_model("model", &provider.model)
            .map_err(|e| invalid("model", e.value, e.reason))?;
        let base = provider.base_url.trim_end_matches('/');
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            let reason = "expected an http(s) URL".into();
            return Err(invalid("base_url", provider.base_url.clone(), reason));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &provider.headers {
            let reason = "expected a valid HTTP header name and value";
            let bad = || invalid("headers", name.clone(), reason.into());
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            if name == AUTHORIZATION {
                return Err(bad());
            }
            headers.insert(name, HeaderValue::from_str(value).map_err(|_| bad())?);
        }
        crate::tls::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| LlmError::Transport {
                message: format!("cannot build the HTTP client ({e})"),
            })?;
        Ok(Self {
            url: format!("{base}/responses"),
            pacer: Pacer::new(&provider.limits),
            provider,
            http,
            token,
            headers,
        })
    }

    pub fn provider(&self) -> &ProviderConfig {
        &self.provider
    }

    /// The token source (for `refresh` at session start, and status without the value).
    pub fn token(&self) -> &TokenProvider {
        &self.token
    }

    /// Re-reads the token; the agent loop calls this at the start of every session.
    pub async fn refresh_token(&self) -> Result<TokenStatus, LlmError> {
        self.token.refresh().await
    }

    /// Runs one turn to `response.completed`, retrying internally. `events` receives deltas
    /// (best effort), retries, token reloads and rate-limit waits; keep it drained.
    pub async fn turn(
        &self,
        req: &TurnRequest,
        events: &Sender<LlmEvent>,
        cancel: &CancellationToken,
    ) -> Result<TurnResponse, LlmError> {
        let body = super::request::build_body(&self.provider, req)?;
        let idle = self.provider.limits.stream_idle_timeout;
        let body = &body;
        let read = |reloaded| async move {
            let resp = self.send(body, reloaded).await?;
            read_events(resp.bytes_stream(), idle, |ev| {
                let _ = events.try_send(ev);
            })
            .await
        };
        let (done, attempts) = self.retrying(body.len(), events, cancel, read).await?;
        Ok(TurnResponse {
            response_id: done.response_id,
            output: done.output,
            usage: done.usage,
            attempts,
        })
    }

    /// Sends a request body built elsewhere (a codex session's, through its relay) with this
    /// provider's token, headers, pacing and retry budget, and returns the response once it
    /// is an event stream; the caller reads the stream. Retries happen only before the first
    /// byte of a stream: a stream cut later is the caller's to retry.
    pub async fn relay(
        &self,
        body: &[u8],
        events: &Sender<LlmEvent>,
        cancel: &CancellationToken,
    ) -> Result<reqwest::Response, LlmError> {
        let send = |reloaded| self.send(body, reloaded);
        let (resp, _) = self.retrying(body.len(), events, cancel, send).await?;
        Ok(resp)
    }

    /// Runs `attempt` (told whether the token was read again after a 401) until it succeeds,
    /// fails for good or runs out of retries; returns its result and the number of attempts.
    async fn retrying<T, F>(
        &self,
        body_len: usize,
        events: &Sender<LlmEvent>,
        cancel: &CancellationToken,
        attempt: impl Fn(bool) -> F,
    ) -> Result<(T, u32), LlmError>
    where
        F: std::future::Future<Output = Result<T, LlmError>>,
    {
        let max_retries = self.provider.limits.max_retries;
        let (mut attempts, mut retries, mut reloaded) = (0u32, 0u32, false);
        loop {
            self.pace(body_len, events, cancel).await?;
            attempts += 1;
            let outcome = tokio::select! {
                biased;
                _ = cancel.cancelled() => Err(LlmError::Cancelled),
                r = attempt(reloaded) => r,
            };
            let err = match outcome {
                Ok(done) => return Ok((done, attempts)),
                Err(e) => e,
            };
            if matches!(err, LlmError::Unauthorized { status: 401, .. }) && !reloaded {
                reloaded = true;
                self.reload_token(events).await?;
                continue;
            }
            if !err.is_retryable() {
                return Err(err);
            }
            if retries >= max_retries {
                return Err(LlmError::RetriesExhausted {
                    attempts,
                    last: Box::new(err),
                });
            }
            retries += 1;
            self.wait_to_retry(&err, retries, events, cancel).await?;
        }
    }

    /// Reads the token again after a 401, and says so.
    async fn reload_token(&self, events: &Sender<LlmEvent>) -> Result<(), LlmError> {
        let status = self.token.reload_after_unauthorized().await?;
        tracing::info!(
            provider = %self.provider.name,
            source = %status.source,
            changed = status.changed,
            "401: token read again"
        );
        let event = LlmEvent::TokenReloaded {
            source: status.source,
            age: status.age,
            changed: status.changed,
            why: "unauthorized",
        };
        send(events, event).await;
        Ok(())
    }

    /// Waits before retry number `retry` after `err`: its `Retry-After`, else the backoff. A
    /// rate limit closes the provider's gate instead, so every session of it waits (in `pace`).
    async fn wait_to_retry(
        &self,
        err: &LlmError,
        retry: u32,
        events: &Sender<LlmEvent>,
        cancel: &CancellationToken,
    ) -> Result<(), LlmError> {
        let max_retries = self.provider.limits.max_retries;
        let delay = err.retry_after().unwrap_or_else(|| backoff_delay(retry));
        // A retry that is still within budget is routine (429s, idle streams): info, not
        // warn. Running out of retries is the error the caller sees.
        tracing::info!(
            provider = %self.provider.name,
            attempt = retry,
            max_retries,
            delay_ms = delay.as_millis() as u64,
            reason = %err.reason(),
            "retrying the turn"
        );
        let rate_limited = matches!(err, LlmError::RateLimited { .. });
        if rate_limited {
            self.pacer.close_gate_for(delay);
        }
        let event = LlmEvent::Retry {
            attempt: retry,
            max_retries,
            reason: err.reason(),
            delay,
        };
        send(events, event).await;
        if !rate_limited {
            sleep_or_cancel(delay, cancel).await?;
        }
        Ok(())
    }

    async fn pace(
        &self,
        body_len: usize,
        events: &Sender<LlmEvent>,
        cancel: &CancellationToken,
    ) -> Result<(), LlmError> {
        while let Some((reason, delay)) = self.pacer.next_wait(body_len) {
            send(events, LlmEvent::RateLimitWait { reason, delay }).await;
            sleep_or_cancel(delay, cancel).await?;
        }
        Ok(())
    }

    /// One POST of `body`; an answer that is not an event stream becomes the error it says.
    async fn send(&self, body: &[u8], reloaded: bool) -> Result<reqwest::Response, LlmError> {
        let idle = self.provider.limits.stream_idle_timeout;
        let request = self
            .http
            .post(&self.url)
            .headers(self.headers.clone())
            .header(AUTHORIZATION, self.token.header().await?)
            .header(ACCEPT, "text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec())
            .send();
        let resp = tokio::time::timeout(idle, request)
            .await
            .map_err(|_| LlmError::IdleTimeout { after: idle })?
            .map_err(transport)?;
        let status = resp.status();
        let json_body = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if status.is_success() && !json_body {
            return Ok(resp);
        }
        let retry_after = parse_retry_after(resp.headers(), SystemTime::now());
        let text = tokio::time::timeout(idle, resp.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let body = parse_error_body(&self.token.scrub(&text));
        Err(match status.as_u16() {
            401 | 403 => LlmError::Unauthorized {
                status: status.as_u16(),
                source_name: self.token.describe(),
                reloaded,
                message: body.message,
            },
            // A gateway that answers 200 with a JSON error instead of a stream.
            200..=299 => LlmError::Fatal {
                status: status.as_u16(),
                message: format!("expected an event stream, got JSON: {}", body.message),
            },
            _ => classify_status(status, retry_after, body),
        })
    }
}

fn transport(e: reqwest::Error) -> LlmError {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    LlmError::Transport { message }
}

async fn send(events: &Sender<LlmEvent>, event: LlmEvent) {
    // A dropped receiver only means nobody is watching.
    let _ = events.send(event).await;
}

async fn sleep_or_cancel(delay: Duration, cancel: &CancellationToken) -> Result<(), LlmError> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(LlmError::Cancelled),
        _ = tokio::time::sleep(delay) => Ok(()),
    }
}
