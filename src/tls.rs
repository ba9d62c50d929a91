//! TLS set-up shared by every HTTP client. reqwest is built with rustls and the `ring`
//! provider (no aws-lc C build), which must be installed once per process before a client is
//! built; every client constructor calls [`install_crypto_provider`] first.

/// Installs rustls' ring provider as the process default; later calls are no-ops.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
