//! The dashboard's access token: 192 random bits, required on every request as `?token=`
//! (then kept in a cookie so links work), as the cookie, or as `Authorization: Bearer`.
//!
//! Loopback is reachable by every user of a shared node, as with notebook servers; the token
//! is what keeps the pages to the user who started the daemon. It is not the provider token
//! and grants nothing but reading this dashboard.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::DashboardState;

/// The cookie that carries the token after a first visit with `?token=`.
pub const COOKIE: &str = "fk_agentd_dashboard";

/// The token a request must present.
#[derive(Clone)]
pub struct AccessToken(Arc<str>);

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(…)")
    }
}

impl AccessToken {
    /// 24 random bytes as 48 hex digits.
    pub fn random() -> Self {
        let bytes: [u8; 24] = rand::random();
        Self(crate::digest::hex(&bytes).into())
    }

    /// The token itself, for the URL.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares in time independent of where the strings differ.
    pub fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// How the request presented the token.
#[derive(Debug, PartialEq)]
enum Presented {
    Query,
    Cookie,
    Bearer,
}

fn query_token(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|kv| kv.strip_prefix("token="))
}

fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn presented(token: &AccessToken, req: &Request) -> Option<Presented> {
    [
        (Presented::Query, query_token(req.uri().query())),
        (Presented::Cookie, cookie_token(req.headers())),
        (Presented::Bearer, bearer_token(req.headers())),
    ]
    .into_iter()
    .find_map(|(how, given)| given.is_some_and(|t| token.matches(t)).then_some(how))
}

/// The middleware: 401 without the token; with `?token=`, sets the cookie.
pub async fn require_token(
    State(state): State<DashboardState>,
    req: Request,
    next: Next,
) -> Response {
    let Some(how) = presented(&state.token, &req) else {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "401 unauthorized: this dashboard needs its access token. Open the URL that \
             fk-agentd printed (it is also in <home>/dashboard.url), or send \
             `Authorization: Bearer <token>`.\n",
        )
            .into_response();
    };
    let mut resp = next.run(req).await;
    if how == Presented::Query {
        let cookie = format!(
            "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
            state.token.expose()
        );
        if let Ok(v) = cookie.parse() {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_has_192_bits_and_matches_only_itself() {
        let t = AccessToken::random();
        assert_eq!(t.expose().len(), 48);
        assert!(t.matches(t.expose()));
        assert!(!t.matches(&t.expose()[..47]));
        assert!(!t.matches(""));
        assert_ne!(t.expose(), AccessToken::random().expose());
    }
}
