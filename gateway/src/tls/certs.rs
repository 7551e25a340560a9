//! Certificates and keys: PEM files, or a self-signed certificate made at start.

use std::path::Path;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject as _};
use thiserror::Error;

/// Errors of loading a certificate and key.
#[derive(Debug, Error)]
pub enum CertError {
    /// The certificate file is unreadable or holds no PEM certificate.
    #[error("certificate file {path}: {reason}")]
    Cert {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The key file is unreadable or holds no PEM private key.
    #[error("key file {path}: {reason}")]
    Key {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The key is not the certificate's.
    #[error("key file {key} does not match the certificate in {cert}")]
    Mismatch {
        /// The certificate file.
        cert: String,
        /// The key file.
        key: String,
    },
    /// The self-signed certificate could not be made.
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A certificate chain and its key.
pub type CertKey = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// Reads a PEM certificate chain and a PEM private key.
pub fn load(cert: &Path, key: &Path) -> Result<CertKey, CertError> {
    let cert_err = |reason: String| CertError::Cert {
        path: cert.display().to_string(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no PEM CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| CertError::Key {
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    Ok((chain, key))
}

/// When the first certificate of the PEM chain in `cert` expires (its `notAfter`), Unix
/// seconds; `None` when the file holds no certificate that parses.
pub fn expiry(cert: &Path) -> Option<i64> {
    let first = CertificateDer::pem_file_iter(cert).ok()?.next()?.ok()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(first.as_ref()).ok()?;
    Some(parsed.validity().not_after.timestamp())
}

/// A self-signed certificate for `localhost`, `127.0.0.1` and `::1`, with a fresh P-256 key.
pub fn self_signed() -> Result<CertKey, CertError> {
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    let ck = rcgen::generate_simple_self_signed(names)?;
    let key = PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
    Ok((vec![ck.cert.der().clone()], key.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificates_expiry_is_its_not_after() {
        let mut params = rcgen::CertificateParams::new(vec!["example.test".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 7, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let path = tmp("expiring.pem", cert.pem().as_bytes());
        // 2031-07-01T00:00:00Z.
        assert_eq!(expiry(&path), Some(1_940_630_400));
        assert_eq!(expiry(&tmp("none.pem", b"no certificate")), None);
    }

    fn tmp(name: &str, body: &[u8]) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("gw-certs-{}-{name}", std::process::id()));
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn bad_files_are_named() {
        let garbage = tmp("garbage.pem", b"not pem at all");
        let e = load(&garbage, &garbage).unwrap_err().to_string();
        assert!(e.starts_with("certificate file"), "{e}");
        assert!(e.contains("garbage.pem"), "{e}");
        let missing = std::path::Path::new("/nonexistent/cert.pem");
        let e = load(missing, missing).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/cert.pem"), "{e}");
        // A good certificate with a garbage key: the key file is named.
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = tmp("cert.pem", ck.cert.pem().as_bytes());
        let e = load(&cert, &garbage).unwrap_err().to_string();
        assert!(e.starts_with("key file"), "{e}");
        // Both good: loaded.
        let key = tmp("key.pem", ck.signing_key.serialize_pem().as_bytes());
        assert_eq!(load(&cert, &key).unwrap().0.len(), 1);
        for p in [garbage, cert, key] {
            let _ = std::fs::remove_file(p);
        }
    }
}
