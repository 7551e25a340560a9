//! One request of each kind the probe sends, timed from its first byte to the answer that ends
//! it: a TLS handshake (new or resumed), an HTTPS GET's first response byte, a SIP final
//! response.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use rustls::{
    ClientConfig, DigitallySignedStruct, SignatureScheme,
    client::{
        Resumption,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use thiserror::Error;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UdpSocket},
};
use tokio_rustls::TlsConnector;

/// What the probe sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeKind {
    /// A full TLS handshake on a new connection (no session offered).
    TlsNew,
    /// A resumed TLS handshake (a session from an earlier handshake offered).
    TlsResumed,
    /// `GET /` over TLS, to the response's first byte.
    HttpGet,
    /// A SIP OPTIONS over UDP, to its final response.
    SipOptions,
    /// A SIP INVITE over UDP, to its final response (then ACK, and BYE after a 2xx).
    SipInvite,
}

impl ProbeKind {
    /// The name used on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            ProbeKind::TlsNew => "tls-new",
            ProbeKind::TlsResumed => "tls-resumed",
            ProbeKind::HttpGet => "http-get",
            ProbeKind::SipOptions => "sip-options",
            ProbeKind::SipInvite => "sip-invite",
        }
    }

    /// Whether requests of this kind are TLS.
    pub const fn is_tls(self) -> bool {
        matches!(
            self,
            ProbeKind::TlsNew | ProbeKind::TlsResumed | ProbeKind::HttpGet
        )
    }
}

/// Why a request failed.
#[derive(Debug, Error)]
pub enum RequestError {
    /// No answer within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A socket or TLS error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server answered, but not as the kind expects.
    #[error("{0}")]
    Answer(String),
}

/// What a client needs to send requests: the target, and for TLS a client configuration.
pub struct Client {
    kind: ProbeKind,
    target: SocketAddr,
    timeout: Duration,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

/// Accepts any certificate (`--insecure`): the probe measures time, not identity.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS settings of a probe: which certificates to trust, and the name to ask for.
pub struct TlsSettings {
    /// PEM file of the CA (or self-signed) certificates to trust; `None` with `insecure`.
    pub ca: Option<std::path::PathBuf>,
    /// Accept any certificate.
    pub insecure: bool,
    /// Server name to send (SNI) and check.
    pub server_name: String,
}

impl Client {
    /// A client of `kind` against `target`.
    pub fn new(
        kind: ProbeKind,
        target: SocketAddr,
        timeout: Duration,
        tls: &TlsSettings,
    ) -> Result<Self, String> {
        let tls = if kind.is_tls() {
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let builder = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?;
            let mut config = if tls.insecure {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                    .with_no_client_auth()
            } else {
                let path = tls.ca.as_ref().ok_or(
                    "a TLS probe needs --ca FILE (the certificates to trust) or --insecure",
                )?;
                let mut roots = rustls::RootCertStore::empty();
                let pem =
                    std::fs::read(path).map_err(|e| format!("--ca {}: {e}", path.display()))?;
                for cert in rustls_pki_certs(&pem) {
                    roots
                        .add(cert)
                        .map_err(|e| format!("--ca {}: {e}", path.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!("--ca {}: no certificate in it", path.display()));
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            };
            if kind == ProbeKind::TlsNew {
                config.resumption = Resumption::disabled();
            }
            let name = ServerName::try_from(tls.server_name.clone())
                .map_err(|e| format!("--server-name {}: {e}", tls.server_name))?;
            Some((TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        Ok(Client {
            kind,
            target,
            timeout,
            tls,
        })
    }

    /// Sends request number `n` and times it. For `tls-resumed`, whether the handshake resumed
    /// comes back too (a client out of tickets does a full one).
    pub async fn request(&self, n: u64) -> Result<(Duration, bool), RequestError> {
        let start = Instant::now();
        let work = async {
            match self.kind {
                ProbeKind::SipOptions | ProbeKind::SipInvite => {
                    self.sip(n).await.map(|()| (false, None))
                }
                _ => self.tls().await,
            }
        };
        let result = match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok((resumed, conn))) => Ok((start.elapsed(), resumed, conn)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RequestError::Timeout(self.timeout)),
        };
        let (took, resumed, conn) = result?;
        if let Some(conn) = conn {
            // Untimed: close, and read the server's tickets on the way (a TLS 1.3 ticket is
            // used once, so each resumption needs the next).
            close_reading(conn, self.timeout).await;
        }
        Ok((took, resumed))
    }

    /// Primes a `tls-resumed` client with a session (one full handshake).
    pub async fn prime(&self) -> Result<(), RequestError> {
        if self.kind == ProbeKind::TlsResumed {
            self.request(0).await?;
        }
        Ok(())
    }

    /// A TLS request: whether it resumed, and for `tls-resumed` the connection still open (to be
    /// closed untimed).
    async fn tls(&self) -> Result<(bool, Option<TlsConn>), RequestError> {
        let (connector, name) = self.tls.as_ref().expect("a TLS kind has a connector");
        let tcp = TcpStream::connect(self.target).await?;
        tcp.set_nodelay(true)?;
        let mut tls = connector.connect(name.clone(), tcp).await?;
        let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        if self.kind == ProbeKind::HttpGet {
            let get = format!(
                "GET / HTTP/1.1\r\nHost: {}\r\nUser-Agent: gateway-probe\r\nConnection: close\r\n\r\n",
                name.to_str()
            );
            tls.write_all(get.as_bytes()).await?;
            let mut first = [0u8; 1];
            if tls.read(&mut first).await? == 0 {
                return Err(RequestError::Answer("closed without a response".into()));
            }
        }
        if self.kind == ProbeKind::TlsResumed {
            return Ok((resumed, Some(tls)));
        }
        let _ = tls.shutdown().await;
        Ok((resumed, None))
    }

    /// A SIP request over UDP from its own socket, retransmitted on RFC 3261's Timer A (T1 =
    /// 500 ms, doubling), until a final response.
    async fn sip(&self, n: u64) -> Result<(), RequestError> {
        let local: SocketAddr = if self.target.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let sock = UdpSocket::bind(local).await?;
        sock.connect(self.target).await?;
        let me = sock.local_addr()?;
        let method = if self.kind == ProbeKind::SipInvite {
            "INVITE"
        } else {
            "OPTIONS"
        };
        let call = format!("probe-{}-{n}@{}", std::process::id(), me.ip());
        let branch = format!("z9hG4bK-probe-{}-{n}", std::process::id());
        let request = sip_message(method, self.target, me, &branch, &call, 1, "");
        let mut t = Duration::from_millis(500);
        let mut buf = [0u8; 4096];
        loop {
            sock.send(request.as_bytes()).await?;
            let (status, to_tag) =
                match tokio::time::timeout(t, final_status(&sock, &mut buf)).await {
                    Ok(answer) => answer?,
                    Err(_) => {
                        t = (t * 2).min(Duration::from_secs(4));
                        continue;
                    }
                };
            if method == "INVITE" {
                // ACK the final response (a 2xx's ACK is end to end, a non-2xx's hop by hop:
                // both go to the target here), and end an established call with a BYE.
                let ack = sip_message("ACK", self.target, me, &branch, &call, 1, &to_tag);
                sock.send(ack.as_bytes()).await?;
                if (200..300).contains(&status) {
                    let bye_branch = format!("{branch}-bye");
                    let bye = sip_message("BYE", self.target, me, &bye_branch, &call, 2, &to_tag);
                    sock.send(bye.as_bytes()).await?;
                }
            }
            return Ok(());
        }
    }
}

/// A client TLS connection.
type TlsConn = tokio_rustls::client::TlsStream<TcpStream>;

/// Sends close_notify and reads until the server closes too (or `timeout`), so that whatever it
/// sent after the handshake (session tickets) is processed.
async fn close_reading(mut conn: TlsConn, timeout: Duration) {
    let _ = conn.shutdown().await;
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(timeout, conn.read_to_end(&mut sink)).await;
}

/// Reads datagrams until a final response (status >= 200); returns its status and To tag.
async fn final_status(sock: &UdpSocket, buf: &mut [u8]) -> Result<(u16, String), RequestError> {
    loop {
        let n = sock.recv(buf).await?;
        let text = String::from_utf8_lossy(&buf[..n]);
        let status: u16 = text
            .strip_prefix("SIP/2.0 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| RequestError::Answer("not a SIP response".into()))?;
        if status >= 200 {
            return Ok((status, to_tag(&text).unwrap_or_default().to_owned()));
        }
    }
}

/// The To tag of a response, if any.
fn to_tag(text: &str) -> Option<&str> {
    let to = text.lines().find(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("to:") || l.starts_with("t:")
    })?;
    let tag = to.split(";tag=").nth(1)?;
    Some(tag.split([';', ' ', '\r']).next().unwrap_or(tag))
}

/// A SIP request with the headers RFC 3261 §8.1.1 requires.
fn sip_message(
    method: &str,
    target: SocketAddr,
    me: SocketAddr,
    branch: &str,
    call: &str,
    cseq: u32,
    to_tag: &str,
) -> String {
    let host = match target {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    let via = match me {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    let to_tag = if to_tag.is_empty() {
        String::new()
    } else {
        format!(";tag={to_tag}")
    };
    format!(
        "{method} sip:probe@{host} SIP/2.0\r\n\
         Via: SIP/2.0/UDP {via};branch={branch};rport\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:probe@{via}>;tag=probe\r\n\
         To: <sip:probe@{host}>{to_tag}\r\n\
         Call-ID: {call}\r\n\
         CSeq: {cseq} {method}\r\n\
         Contact: <sip:probe@{via}>\r\n\
         Content-Length: 0\r\n\r\n"
    )
}

/// The certificates of a PEM file.
fn rustls_pki_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sip_requests_carry_what_rfc_3261_requires_and_parse() {
        let target: SocketAddr = "10.0.0.1:5060".parse().unwrap();
        let me: SocketAddr = "10.0.0.2:40000".parse().unwrap();
        let m = sip_message("INVITE", target, me, "z9hG4bK-1", "c1@x", 1, "");
        let info = gateway_common::sip::parse_sip(
            &gateway_common::bytes::SliceBytes(m.as_bytes()),
            m.len(),
        );
        assert_eq!(info.kind(), gateway_common::sip::MessageKind::Request);
        assert!(info.unit_key().is_some(), "{m}");
        let ack = sip_message("ACK", target, me, "z9hG4bK-1", "c1@x", 1, "abc");
        assert!(
            ack.contains("To: <sip:probe@10.0.0.1:5060>;tag=abc\r\n"),
            "{ack}"
        );
        assert_eq!(
            to_tag("SIP/2.0 200 OK\r\nTo: <sip:a@b>;tag=xyz;foo\r\n\r\n"),
            Some("xyz")
        );
        assert_eq!(to_tag("SIP/2.0 200 OK\r\nTo: <sip:a@b>\r\n\r\n"), None);
    }
}
