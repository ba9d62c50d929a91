//! Retry timing: exponential backoff with jitter, and the server's own wait
//! (`retry-after-ms`, `Retry-After` in seconds or as an HTTP date).

use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::header::HeaderMap;

/// First backoff step; doubles per attempt.
const BASE: Duration = Duration::from_secs(1);
/// Longest backoff step.
const CAP: Duration = Duration::from_secs(60);
/// Longest wait taken from a server header (a bad header must not park a run for a day).
const MAX_SERVER_WAIT: Duration = Duration::from_secs(15 * 60);

/// The wait before retry number `attempt` (1-based): 1 s·2^(attempt−1), capped at 60 s,
/// times a jitter in [0.9, 1.1) so sessions that failed together do not retry together.
pub fn backoff_delay(attempt: u32) -> Duration {
    let step = BASE.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    step.min(CAP).mul_f64(rand::rng().random_range(0.9..1.1))
}

/// The wait a response asks for, from `retry-after-ms` or `Retry-After` (seconds or an HTTP
/// date), capped at 15 minutes. `now` is the wall clock, for dates.
pub fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let wait = if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        Duration::try_from_secs_f64(ms / 1000.0).ok()
    } else {
        let value = text("retry-after")?;
        match value.parse::<f64>() {
            Ok(secs) => Duration::try_from_secs_f64(secs).ok(),
            Err(_) => http_date(value).map(|t| t.duration_since(now).unwrap_or(Duration::ZERO)),
        }
    };
    wait.map(|w| w.min(MAX_SERVER_WAIT))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(value: &str) -> Option<SystemTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let t = time::PrimitiveDateTime::parse(value, format).ok()?;
    Some(t.assume_utc().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn retry_after_in_its_three_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "7")]), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after(
                &headers(&[("retry-after-ms", "1500"), ("retry-after", "9")]),
                now
            ),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after(
                &headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")]),
                now
            ),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "99999")]), now),
            Some(MAX_SERVER_WAIT)
        );
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "soon")]), now),
            None
        );
        assert_eq!(parse_retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        for (attempt, base) in [(1, 1.0), (2, 2.0), (3, 4.0), (7, 60.0), (40, 60.0)] {
            let d = backoff_delay(attempt).as_secs_f64();
            assert!(d >= base * 0.9 && d < base * 1.1, "attempt {attempt}: {d}");
        }
    }
}
