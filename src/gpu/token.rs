//! Per-session lease tokens: what lets an agent's own shell run `fk-agentd lease` as its session.
//!
//! The daemon hands a token to each session's tool environment (`FK_AGENTD_LEASE_TOKEN`); the
//! control API maps it back to the session, so a request can never name another session. A
//! token is valid while its session holds it ([`crate::gpu::SessionToken`]): it is revoked when
//! dropped, at the session's end.
//! Only a SHA-256 of each token is kept, and tokens are compared by that digest.

use std::collections::HashMap;
use std::sync::Mutex;

use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

use crate::digest::sha256_hex;
use crate::sync::guard;

/// A session's lease token. Its `Debug` does not show the value.
#[derive(Clone)]
pub struct LeaseToken(SecretString);

impl std::fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseToken(***)")
    }
}

impl LeaseToken {
    /// The value to put in the session's tool environment.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

/// Digest → session.
#[derive(Default)]
pub(crate) struct TokenBook {
    by_digest: Mutex<HashMap<String, String>>,
}

impl TokenBook {
    pub fn issue(&self, session: &str) -> LeaseToken {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let value = format!("fkl_{}", crate::digest::hex(&bytes));
        guard(&self.by_digest).insert(sha256_hex(value.as_bytes()), session.to_string());
        LeaseToken(SecretString::from(value))
    }

    pub fn session_of(&self, token: &str) -> Option<String> {
        guard(&self.by_digest)
            .get(&sha256_hex(token.as_bytes()))
            .cloned()
    }

    pub fn revoke(&self, token: &LeaseToken) {
        guard(&self.by_digest).remove(&sha256_hex(token.expose().as_bytes()));
    }
}
