//! [`TokenProvider`]: where the bearer token comes from and when it is read again.
//!
//! A token file is re-read at every [`TokenProvider::refresh`] (the agent loop calls it at
//! session start), before any request once the file was rewritten (its modification time
//! changed), and after every 401, so a rotated file needs no restart and costs no 401. A token command is
//! cached for its configured interval; an environment token is captured once, at the edge.
//!
//! The value lives in a `SecretString` and in one sensitive `HeaderValue`; errors and
//! [`TokenStatus`] name the source and the token's age, never the token. It is trimmed and
//! validated as a header value, so a trailing newline is harmless and a bad byte is an error,
//! not a panic.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderValue;
use secrecy::{ExposeSecret, SecretString};
use tokio::time::Instant;

use super::LlmError;
use crate::config::provider::TokenSource;
use crate::sync::guard;

/// How long a token command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

enum Source {
    File(PathBuf),
    Env {
        var: String,
        value: Option<String>,
    },
    Command {
        argv: Vec<String>,
        refresh: Duration,
    },
    Literal,
}

struct Loaded {
    token: SecretString,
    header: HeaderValue,
    fetched_at: Instant,
    /// When the token was written (file mtime), for its age.
    written: Option<SystemTime>,
}

/// What a (re)load found: where from, how old, whether it differs from the previous one.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TokenStatus {
    pub source: String,
    pub age: Option<Duration>,
    pub changed: bool,
}

/// The provider token and how to read it again. `Debug` shows the source only.
pub struct TokenProvider {
    source: Source,
    state: Mutex<Option<Loaded>>,
}

impl std::fmt::Debug for TokenProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenProvider")
            .field("source", &self.describe())
            .field("token", &"[REDACTED]")
            .finish()
    }
}

impl TokenProvider {
    /// A provider for a configured source. `env` looks up environment variables (the CLI
    /// passes the process environment; library code never reads it itself). The token is not
    /// read yet: call [`refresh`](Self::refresh).
    pub fn from_source(
        source: &TokenSource,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, LlmError> {
        let source = match source {
            TokenSource::File { path } => Source::File(path.clone()),
            TokenSource::Env { var } => Source::Env {
                var: var.clone(),
                value: env(var),
            },
            TokenSource::Command { argv, refresh } => Source::Command {
                argv: argv.clone(),
                refresh: *refresh,
            },
            TokenSource::Sim => {
                let why = "the simulated provider hands its token in with TokenProvider::literal";
                return Err(token_error("simulation", why));
            }
        };
        Ok(Self {
            source,
            state: Mutex::new(None),
        })
    }

    /// A fixed token handed in by the caller (the embedded simulation, tests).
    pub fn literal(token: SecretString) -> Result<Self, LlmError> {
        let loaded = load_value(token.expose_secret(), "a literal token", None)?;
        Ok(Self {
            source: Source::Literal,
            state: Mutex::new(Some(loaded)),
        })
    }

    /// A token file, read at every refresh.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            source: Source::File(path.into()),
            state: Mutex::new(None),
        }
    }

    /// Where the token comes from, safe to print.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::File(p) => format!("file {}", p.display()),
            Source::Env { var, .. } => format!("environment variable {var}"),
            // Only the program: its arguments may carry a path or a secret.
            Source::Command { argv, .. } => {
                format!("command `{}`", argv.first().map_or("", String::as_str))
            }
            Source::Literal => "a literal token".into(),
        }
    }

    /// Reads the token again (a file always; a command when its cache expired). Call it at
    /// the start of every session.
    pub async fn refresh(&self) -> Result<TokenStatus, LlmError> {
        self.reload(false).await
    }

    /// Reads the token again after a 401, re-running a command even inside its interval.
    pub async fn reload_after_unauthorized(&self) -> Result<TokenStatus, LlmError> {
        self.reload(true).await
    }

    /// The `Authorization` header value, loading the token on first use.
    pub async fn header(&self) -> Result<HeaderValue, LlmError> {
        if let Some(h) = self.cached_header() {
            return Ok(h);
        }
        self.reload(false).await?;
        self.cached_header()
            .ok_or_else(|| token_error(&self.describe(), "no token loaded"))
    }

    /// The status of the token now held, without reading it again.
    pub fn status(&self) -> Option<TokenStatus> {
        let state = guard(&self.state);
        state.as_ref().map(|l| TokenStatus {
            source: self.describe(),
            age: age_of(l),
            changed: false,
        })
    }

    /// Replaces every form of the current token in `text` (as it is, reversed, hex, base64,
    /// base32, gzip then base64: [`super::redact`]); server messages may echo what they were
    /// sent, and agent output may hold what confinement missed.
    pub fn scrub(&self, text: &str) -> String {
        let state = guard(&self.state);
        match state.as_ref() {
            Some(l) if !l.token.expose_secret().is_empty() => {
                super::redact::redact(text, l.token.expose_secret())
            }
            _ => text.to_string(),
        }
    }

    fn cached_header(&self) -> Option<HeaderValue> {
        let state = guard(&self.state);
        let loaded = state.as_ref()?;
        let expired = match &self.source {
            Source::Command { refresh, .. } => loaded.fetched_at.elapsed() >= *refresh,
            // A file rewritten since it was read (a rotation) is read again before the next
            // request, not after a 401; one that cannot be looked at keeps the token held.
            Source::File(path) => std::fs::metadata(path)
                .and_then(|m| m.modified())
                .is_ok_and(|m| Some(m) != loaded.written),
            _ => false,
        };
        (!expired).then(|| loaded.header.clone())
    }

    async fn reload(&self, force: bool) -> Result<TokenStatus, LlmError> {
        let name = self.describe();
        let fresh = match &self.source {
            Source::Literal => None,
            Source::File(path) => Some(read_file(path, &name).await?),
            Source::Env { var, value } => {
                let value = value
                    .as_deref()
                    .ok_or_else(|| token_error(&name, format!("{var} is not set")))?;
                Some(load_value(value, &name, None)?)
            }
            Source::Command { argv, .. } => {
                if !force && self.cached_header().is_some() {
                    None
                } else {
                    Some(run_command(argv, &name).await?)
                }
            }
        };
        let mut state = guard(&self.state);
        let mut changed = false;
        if let Some(new) = fresh {
            let old = state.as_ref().map(|o| o.token.expose_secret());
            changed = old.is_some_and(|o| o != new.token.expose_secret());
            *state = Some(new);
        }
        Ok(TokenStatus {
            source: name,
            age: state.as_ref().and_then(age_of),
            changed,
        })
    }
}

fn age_of(l: &Loaded) -> Option<Duration> {
    match l.written {
        Some(t) => SystemTime::now().duration_since(t).ok(),
        None => Some(l.fetched_at.elapsed()),
    }
}

/// An error reading the token from the source `name`.
fn token_error(name: &str, reason: impl Into<String>) -> LlmError {
    LlmError::Token {
        source_name: name.to_string(),
        reason: reason.into(),
    }
}

async fn read_file(path: &std::path::Path, name: &str) -> Result<Loaded, LlmError> {
    let bad = |reason: String| token_error(name, reason);
    let meta = tokio::fs::metadata(path)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => bad("the file does not exist".into()),
            _ => bad(format!("cannot read it ({})", e.kind())),
        })?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|e| bad(format!("cannot read it ({})", e.kind())))?;
    let text = SecretString::from(
        String::from_utf8(bytes).map_err(|_| bad("the file is not UTF-8 text".into()))?,
    );
    load_value(text.expose_secret(), name, meta.modified().ok())
}

async fn run_command(argv: &[String], name: &str) -> Result<Loaded, LlmError> {
    let bad = |reason: String| token_error(name, reason);
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| bad("empty command".into()))?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(COMMAND_TIMEOUT, child)
        .await
        .map_err(|_| {
            bad(format!(
                "did not finish within {}s",
                COMMAND_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| bad(format!("cannot run it ({e})")))?;
    if !out.status.success() {
        return Err(bad(format!("exited with {}", out.status)));
    }
    let text = SecretString::from(
        String::from_utf8(out.stdout).map_err(|_| bad("its output is not UTF-8 text".into()))?,
    );
    load_value(text.expose_secret(), name, None)
}

fn load_value(raw: &str, name: &str, written: Option<SystemTime>) -> Result<Loaded, LlmError> {
    let bad = |reason: &str| token_error(name, reason);
    let token = raw.trim();
    if token.is_empty() {
        return Err(bad("the token is empty"));
    }
    if token.chars().any(char::is_whitespace) {
        return Err(bad("the token contains whitespace inside it"));
    }
    let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| bad("the token has bytes not allowed in an HTTP header"))?;
    header.set_sensitive(true);
    Ok(Loaded {
        token: SecretString::from(token.to_string()),
        header,
        fetched_at: Instant::now(),
        written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[tokio::test]
    async fn trailing_newline_is_trimmed_and_debug_hides_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pat");
        std::fs::write(&path, "s3cr3t-value\n").unwrap();
        let p = TokenProvider::file(&path);
        let status = p.refresh().await.unwrap();
        assert_eq!(status.changed, false);
        assert_eq!(p.header().await.unwrap(), "Bearer s3cr3t-value");
        assert!(!format!("{p:?}").contains("s3cr3t"));
        assert!(p.header().await.unwrap().is_sensitive());
    }

    /// A rotated file is read before the next request, so no request carries the old token.
    #[tokio::test]
    async fn a_rewritten_file_is_read_before_the_next_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pat");
        std::fs::write(&path, "first\n").unwrap();
        let p = TokenProvider::file(&path);
        assert_eq!(p.header().await.unwrap(), "Bearer first");
        std::fs::write(&path, "second\n").unwrap();
        // Rotations can land within one timestamp tick: make the change visible.
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(p.header().await.unwrap(), "Bearer second");
        // A file that vanished mid-rotation keeps the token held.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(p.header().await.unwrap(), "Bearer second");
    }

    #[tokio::test]
    async fn an_empty_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope");
        std::fs::write(&path, " \n").unwrap();
        let err = TokenProvider::file(&path).refresh().await.unwrap_err();
        assert!(err.to_string().ends_with("the token is empty"), "{err}");
    }

    #[tokio::test]
    async fn a_control_byte_is_an_error_not_a_panic() {
        let err = TokenProvider::literal(SecretString::from("ab\u{7}cd")).unwrap_err();
        assert!(
            err.to_string().contains("not allowed in an HTTP header"),
            "{err}"
        );
        assert!(!err.to_string().contains("ab\u{7}cd"));
    }

    #[tokio::test]
    async fn env_token_is_captured_at_the_edge() {
        let source = TokenSource::Env { var: "TOK".into() };
        let p = TokenProvider::from_source(&source, |k| (k == "TOK").then(|| "v1".into())).unwrap();
        p.refresh().await.unwrap();
        assert_eq!(p.header().await.unwrap(), "Bearer v1");
        let missing = TokenProvider::from_source(&source, |_| None).unwrap();
        assert_eq!(
            missing.refresh().await.unwrap_err().to_string(),
            "provider token from environment variable TOK: TOK is not set"
        );
    }

    #[tokio::test]
    async fn a_command_token_is_cached_until_forced() {
        let dir = tempfile::tempdir().unwrap();
        let counter = dir.path().join("n");
        let script = format!(
            "echo x >> {0}; printf 'tok-%s' $(wc -l < {0})",
            counter.display()
        );
        let source = TokenSource::Command {
            argv: vec!["sh".into(), "-c".into(), script],
            refresh: Duration::from_secs(300),
        };
        let p = TokenProvider::from_source(&source, |_| None).unwrap();
        p.refresh().await.unwrap();
        assert_eq!(p.header().await.unwrap(), "Bearer tok-1");
        assert_eq!(p.refresh().await.unwrap().changed, false);
        assert_eq!(p.header().await.unwrap(), "Bearer tok-1");
        assert_eq!(p.reload_after_unauthorized().await.unwrap().changed, true);
        assert_eq!(p.header().await.unwrap(), "Bearer tok-2");
    }
}
