//! TLS termination with rustls (the aws-lc-rs provider, TLS 1.2 and 1.3, X25519MLKEM768 preferred):
//! certificates, a session cache and a rotating ticketer that publish what they issue to the
//! datapath.

pub mod certs;
pub mod config;
pub mod lineage;
pub mod server_keys;
pub mod sni;
pub mod store;
pub mod tickets;

use std::sync::Arc;

use rustls::{ServerConfig, crypto::aws_lc_rs};
use thiserror::Error;

use crate::{
    issued::IssuedKeys,
    tls::config::{TlsConfig, TlsVersion},
};

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
    let mut provider = aws_lc_rs::default_provider();
    if !cfg.cipher_suites.is_empty() {
        provider.cipher_suites.retain(|s| {
            cfg.cipher_suites
                .contains(&crate::tls::config::suite_name(s))
        });
    }
    let versions: &[&rustls::SupportedProtocolVersion] = match cfg.min_version {
        TlsVersion::V12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V13 => &[&rustls::version::TLS13],
    };
    let certified = |chain, key, (cert, key_path): (&std::path::Path, &std::path::Path)| {
        rustls::sign::CertifiedKey::from_der(chain, key, &provider)
            .map(Arc::new)
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => TlsError::Certs(certs::CertError::Mismatch {
                    cert: cert.display().to_string(),
                    key: key_path.display().to_string(),
                }),
                e => TlsError::Rustls(e),
            })
    };
    let default = match &cfg.cert_key {
        Some((cert, key)) => {
            let (chain, k) = certs::load(cert, key)?;
            certified(chain, k, (cert, key))?
        }
        None => {
            let (chain, k) = certs::self_signed()?;
            let none = std::path::Path::new("(self-signed)");
            certified(chain, k, (none, none))?
        }
    };
    let mut by_name = Vec::new();
    for entry in &cfg.sni {
        let (chain, k) = certs::load(&entry.cert, &entry.key)?;
        by_name.push((
            entry.clone(),
            certified(chain, k, (&entry.cert, &entry.key))?,
        ));
    }
    let resolver = Arc::new(sni::Resolver::new(default, by_name));
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
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
