//! TLS termination with rustls (the aws-lc-rs provider, TLS 1.2 and 1.3, X25519MLKEM768 preferred):
//! certificates, a session cache and a rotating ticketer that publish what they issue to the
//! datapath.

pub mod certs;
pub mod store;
pub mod tickets;

use std::sync::Arc;

use rustls::{ServerConfig, crypto::aws_lc_rs};
use thiserror::Error;

use crate::{issued::IssuedKeys, proxy::config::TlsConfig};

/// Errors of setting TLS up.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A certificate or key file.
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    /// The ticket key file.
    #[error(transparent)]
    Tickets(#[from] tickets::TicketError),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The server configuration of one listener: its certificate (from files, or self-signed), a
/// publishing session cache and a publishing rotating ticketer.
pub fn server_config(cfg: &TlsConfig, issued: Arc<IssuedKeys>) -> Result<ServerConfig, TlsError> {
    let (chain, key) = match &cfg.cert_key {
        Some((cert, key)) => certs::load(cert, key)?,
        None => certs::self_signed()?,
    };
    let provider = Arc::new(aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| match (&cfg.cert_key, e) {
            (Some((cert, key)), rustls::Error::InconsistentKeys(_)) => {
                TlsError::Certs(certs::CertError::Mismatch {
                    cert: cert.display().to_string(),
                    key: key.display().to_string(),
                })
            }
            (_, e) => TlsError::Rustls(e),
        })?;
    config.session_storage = Arc::new(store::PublishingCache::new(
        cfg.session_cache,
        issued.clone(),
    ));
    let secret = match &cfg.ticket_key_file {
        Some(path) => tickets::Secret::from_file(path)?,
        None => tickets::Secret::random()?,
    };
    // One TLS 1.3 ticket per handshake (rustls sends two by default): a client uses each once
    // and gets a fresh one with every resumption, so a second buys nothing but another key to
    // publish (issue 28: keys churned through the table at twice the handshake rate).
    config.send_tls13_tickets = 1;
    config.ticketer = Arc::new(tickets::RotatingTicketer::new(
        secret,
        cfg.ticket_rotation.0,
        cfg.session_lifetime.0,
        issued,
    ));
    Ok(config)
}
