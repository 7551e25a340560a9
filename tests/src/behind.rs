//! An openssl `s_server` on tcp/443 in the gateway's namespace, behind `gateway run`, and the
//! figures the tests read of it: the harness of the TLS namespace tests.

use std::{net::TcpStream, time::Duration};

use crate::{
    daemon::Daemon,
    netns::{GW_V4, TestNet, class_counter},
    tls::{Cert, Proc, s_client_input, s_server, session_key, wait_listening},
};

/// What the clients send: `s_server -www` answers it and closes.
pub const GET: &[u8] = b"GET / HTTP/1.0\r\n\r\n";

/// An s_server on 443 behind the gateway; the daemon is stopped (and must exit cleanly) on drop.
pub struct BehindGateway {
    /// The namespaces.
    pub net: TestNet,
    /// The server's certificate.
    pub cert: Cert,
    _server: Proc,
    daemon: Option<Daemon>,
}

impl BehindGateway {
    /// Namespaces, an s_server on 443 with `server_opts`, and `gateway run` with the config
    /// `services` (YAML, its `services:` section).
    pub fn new(server_opts: &[&str], services: &str) -> Self {
        let net = TestNet::new();
        let cert = Cert::new();
        let server = s_server(
            &["ip", "netns", "exec", &net.gw_ns],
            &cert,
            443,
            server_opts,
        );
        wait_listening(|| net.in_gw(|| TcpStream::connect(("127.0.0.1", 443)).is_ok()));
        let daemon = Daemon::start_config(&net, &cert.file(""), services);
        BehindGateway {
            net,
            cert,
            _server: server,
            daemon: Some(daemon),
        }
    }

    /// s_client from the peer namespace with `args`, sending [`GET`]; its output.
    pub fn client(&self, args: &[&str]) -> String {
        s_client_input(
            &["ip", "netns", "exec", &self.net.peer_ns],
            &format!("{GW_V4}:443"),
            args,
            GET,
        )
    }

    /// A full handshake (`version`, e.g. `-tls1_3`) whose session is saved, and the session's
    /// key published as `kind` (`psk`, `ticket`, `session-id`): the session file for
    /// `-sess_in`, and the client's output.
    pub fn published_session(&self, version: &str, kind: &str) -> (std::path::PathBuf, String) {
        let sess = self.cert.file("sess.pem");
        let out = self.client(&[version, "-sess_out", sess.to_str().unwrap(), "-ign_eof"]);
        let key = session_key(&sess);
        self.net
            .gateway_ok(&["tls", "issued", "add", &key, "--kind", kind]);
        (sess, out)
    }

    /// The TLS counter `field` (`gateway stats`).
    pub fn tls(&self, field: &str) -> u64 {
        self.net.stats()["tls"][field].as_u64().unwrap()
    }

    /// The counter `field` of `class`.
    pub fn counter(&self, class: &str, field: &str) -> u64 {
        class_counter(&self.net.stats(), class, field)
    }
}

impl Drop for BehindGateway {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            let (status, log) = d.terminate(Duration::from_secs(10));
            if !std::thread::panicking() {
                assert!(status.success(), "{log:?}");
            }
        }
    }
}
