//! Which certificate a listener serves a client: the one whose `names` (`tls.sni`) hold the
//! name the client's hello asks for, else the listener's own `cert` (no name asked, or none of
//! them). Names are compared in lower case, exactly or by `*.` and a one-label suffix.

use std::sync::Arc;

use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

use crate::tls::config::SniCert;

/// The certificate resolver of one listener.
#[derive(Debug)]
pub struct Resolver {
    default: Arc<CertifiedKey>,
    by_name: Vec<(SniCert, Arc<CertifiedKey>)>,
}

impl Resolver {
    /// Serves `default` unless an entry of `by_name` has the name asked for.
    pub fn new(default: Arc<CertifiedKey>, by_name: Vec<(SniCert, Arc<CertifiedKey>)>) -> Self {
        Resolver { default, by_name }
    }

    /// The certificate for a hello that asks for `name` (`None`: no name).
    pub fn pick(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name.map(str::to_ascii_lowercase) else {
            return self.default.clone();
        };
        self.by_name
            .iter()
            .find(|(entry, _)| entry.serves(&name))
            .map_or_else(|| self.default.clone(), |(_, key)| key.clone())
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Arc<CertifiedKey> {
        let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
        Arc::new(
            CertifiedKey::from_der(
                vec![ck.cert.der().clone()],
                der.into(),
                &rustls::crypto::aws_lc_rs::default_provider(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn the_name_asked_for_picks_its_certificate_and_anything_else_the_default() {
        let (default, two, wild) = (key("one.test"), key("two.test"), key("x.wild.test"));
        let entry = |names: &[&str]| SniCert {
            names: names.iter().map(|n| n.to_string()).collect(),
            cert: "c.pem".into(),
            key: "k.pem".into(),
        };
        let r = Resolver::new(
            default.clone(),
            vec![
                (entry(&["two.test", "deux.test"]), two.clone()),
                (entry(&["*.wild.test"]), wild.clone()),
            ],
        );
        let is = |picked: Arc<CertifiedKey>, want: &Arc<CertifiedKey>| Arc::ptr_eq(&picked, want);
        assert!(is(r.pick(Some("two.test")), &two));
        assert!(is(r.pick(Some("DEUX.test")), &two));
        assert!(is(r.pick(Some("a.wild.test")), &wild));
        // One label only, and the bare suffix is not the wildcard's.
        assert!(is(r.pick(Some("a.b.wild.test")), &default));
        assert!(is(r.pick(Some("wild.test")), &default));
        assert!(is(r.pick(Some("three.test")), &default));
        assert!(is(r.pick(None), &default));
    }
}
