//! The session ticket keys of a server the gateway does not terminate, read from the server's
//! own key files, for the NIC to check the MAC of the tickets it issued
//! (`gateway_common::maps::TLS_TICKET_KEYS`).
//!
//! Every format is a key name (16 bytes), an HMAC-SHA256 key and an AES key, in the server's own
//! order:
//! - nginx (`ssl_session_ticket_key`, one file per key, raw): 48 bytes are name, AES-128 key,
//!   HMAC key (16); 80 bytes are name, HMAC key (32), AES-256 key.
//! - HAProxy (`tls-ticket-keys`, one file, a base64 key per line): 48 bytes are name, AES key
//!   (16), HMAC key (16); 80 bytes are name, AES key (32), HMAC key (32).
//! - Envoy (`session_ticket_keys`, one file per key, raw): 80 bytes, name, HMAC key (32), AES
//!   key.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use gateway_common::{
    maps::{TicketKeyId, TicketMacKey},
    sha256,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Whose key files these are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyFormat {
    /// nginx's `ssl_session_ticket_key` files.
    Nginx,
    /// HAProxy's `tls-ticket-keys` file.
    Haproxy,
    /// Envoy's `session_ticket_keys` files.
    Envoy,
}

/// Errors reading a key file.
#[derive(Debug, Error)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file (or one of its lines) is not a key of its format.
    #[error("{path}{line}: {why}")]
    Format {
        /// The file.
        path: String,
        /// `:N` for a line of a HAProxy file, else empty.
        line: String,
        /// What is wrong.
        why: String,
    },
    /// No key at all.
    #[error("{0}: no ticket key in the files")]
    Empty(String),
}

/// One ticket key: its name and its HMAC key (the AES key never leaves the file).
#[derive(Clone, PartialEq, Eq)]
pub struct TicketKey {
    /// The 16-byte name a ticket sealed with it starts with.
    pub name: [u8; 16],
    /// The HMAC-SHA256 key.
    pub hmac: Vec<u8>,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("TicketKey")
            .field("name", &hex(&self.name))
            .finish_non_exhaustive()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl TicketKey {
    /// The key as the NIC holds it for the listener on `port`.
    pub fn to_map(&self, port: u16) -> (TicketKeyId, TicketMacKey) {
        let (inner, outer) = sha256::pads(&self.hmac).expect("HMAC keys are 16 or 32 bytes");
        (
            TicketKeyId {
                port,
                pad: 0,
                name: self.name,
            },
            TicketMacKey { inner, outer },
        )
    }
}

/// A key of `bytes` in `format`; why not.
fn parse_key(format: KeyFormat, bytes: &[u8]) -> Result<TicketKey, String> {
    let (hmac, sizes) = match (format, bytes.len()) {
        (KeyFormat::Nginx, 48) => (&bytes[32..48], ""),
        (KeyFormat::Nginx, 80) => (&bytes[16..48], ""),
        (KeyFormat::Haproxy, 48) => (&bytes[32..48], ""),
        (KeyFormat::Haproxy, 80) => (&bytes[48..80], ""),
        (KeyFormat::Envoy, 80) => (&bytes[16..48], ""),
        (KeyFormat::Envoy, _) => (&bytes[..0], "80"),
        _ => (&bytes[..0], "48 or 80"),
    };
    if !sizes.is_empty() {
        return Err(format!("{} bytes, a key is {sizes}", bytes.len()));
    }
    let mut name = [0u8; 16];
    name.copy_from_slice(&bytes[..16]);
    Ok(TicketKey {
        name,
        hmac: hmac.to_vec(),
    })
}

/// Reads the keys of `files` in `format`, in the files' order.
pub fn read(format: KeyFormat, files: &[PathBuf]) -> Result<Vec<TicketKey>, KeyFileError> {
    let mut keys = Vec::new();
    for path in files {
        keys.extend(read_file(format, path)?);
    }
    if keys.is_empty() {
        let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        return Err(KeyFileError::Empty(names.join(", ")));
    }
    Ok(keys)
}

fn read_file(format: KeyFormat, path: &Path) -> Result<Vec<TicketKey>, KeyFileError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| KeyFileError::Read {
        path: shown.clone(),
        source,
    })?;
    let bad = |line: Option<usize>, why: String| KeyFileError::Format {
        path: shown.clone(),
        line: line.map(|n| format!(":{n}")).unwrap_or_default(),
        why,
    };
    match format {
        KeyFormat::Nginx | KeyFormat::Envoy => {
            Ok(vec![parse_key(format, &bytes).map_err(|w| bad(None, w))?])
        }
        KeyFormat::Haproxy => {
            let text = String::from_utf8(bytes)
                .map_err(|_| bad(None, "not text: a base64 key per line".into()))?;
            let mut keys = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(line)
                    .map_err(|e| bad(Some(i + 1), format!("not base64: {e}")))?;
                keys.push(parse_key(format, &raw).map_err(|w| bad(Some(i + 1), w))?);
            }
            Ok(keys)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gw-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn key_bytes(n: usize) -> Vec<u8> {
        (0..n as u8).collect()
    }

    #[test]
    fn each_format_finds_its_name_and_hmac_key() {
        let k48 = key_bytes(48);
        let k80 = key_bytes(80);
        let nginx = read(KeyFormat::Nginx, &[temp("n48", &k48), temp("n80", &k80)]).unwrap();
        assert_eq!(nginx[0].name[..], k48[..16]);
        assert_eq!(nginx[0].hmac, k48[32..48]);
        assert_eq!(nginx[1].hmac, k80[16..48]);
        let envoy = read(KeyFormat::Envoy, &[temp("e80", &k80)]).unwrap();
        assert_eq!(envoy[0].hmac, k80[16..48]);
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let text = format!("# keys\n{}\n\n{}\n", b64(&k48), b64(&k80));
        let ha = read(KeyFormat::Haproxy, &[temp("ha", text.as_bytes())]).unwrap();
        assert_eq!(ha.len(), 2);
        assert_eq!(ha[0].hmac, k48[32..48]);
        assert_eq!(ha[1].hmac, k80[48..80]);
        // The NIC's form: the pads of the HMAC key, under the port.
        let (id, mac) = nginx[0].to_map(443);
        assert_eq!((id.port, id.name), (443, nginx[0].name));
        assert_eq!((mac.inner, mac.outer), sha256::pads(&k48[32..48]).unwrap());
    }

    #[test]
    fn a_bad_file_is_refused_naming_it() {
        let e = read(KeyFormat::Nginx, &[temp("short", &key_bytes(47))]).unwrap_err();
        assert!(
            e.to_string().contains("short: 47 bytes, a key is 48 or 80"),
            "{e}"
        );
        let e = read(KeyFormat::Envoy, &[temp("e48", &key_bytes(48))]).unwrap_err();
        assert!(e.to_string().contains("48 bytes, a key is 80"), "{e}");
        let e = read(KeyFormat::Haproxy, &[temp("hab", b"AAAA\n!!\n")]).unwrap_err();
        assert!(e.to_string().contains("hab:1: 3 bytes"), "{e}");
        let e = read(KeyFormat::Haproxy, &[temp("hac", b"# none\n")]).unwrap_err();
        assert!(e.to_string().contains("no ticket key"), "{e}");
        let missing = std::env::temp_dir().join("gw-keys-none/absent");
        let e = read(KeyFormat::Nginx, &[missing]).unwrap_err();
        assert!(e.to_string().contains("absent"), "{e}");
    }
}
