//! A ClientHello builder.

use alloc::vec::Vec;

/// A ClientHello to build: which offers it carries and how big its key share is.
#[derive(Clone, Debug)]
pub struct HelloBuilder {
    /// Legacy session id (TLS 1.3 clients send 32 random bytes).
    pub session_id: Vec<u8>,
    /// Announce TLS 1.3 in supported_versions (with 1.2 after it).
    pub tls13: bool,
    /// A session_ticket extension with this content (empty: present but no ticket).
    pub ticket: Option<Vec<u8>>,
    /// A pre_shared_key extension with this identity (placed last).
    pub psk_identity: Option<Vec<u8>>,
    /// Size of the key_share entry (X25519MLKEM768 is 1216 bytes).
    pub key_share_len: usize,
    /// Put supported_versions after the key share (as some clients do).
    pub versions_after_key_share: bool,
    /// Extra opaque extensions (type, length) before the rest.
    pub padding_extensions: Vec<(u16, usize)>,
    /// The supported_versions list, replacing the one `tls13` implies.
    pub versions: Option<Vec<u16>>,
}

impl Default for HelloBuilder {
    fn default() -> Self {
        HelloBuilder {
            session_id: Vec::new(),
            tls13: false,
            ticket: None,
            psk_identity: None,
            key_share_len: 32,
            versions_after_key_share: false,
            padding_extensions: Vec::new(),
            versions: None,
        }
    }
}

fn ext(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

impl HelloBuilder {
    /// A TLS 1.3 hello in middlebox-compatibility mode (random 32-byte session id).
    pub fn tls13() -> Self {
        HelloBuilder {
            session_id: (0..32).map(|i| 0xc0 ^ i as u8).collect(),
            tls13: true,
            ticket: Some(Vec::new()),
            key_share_len: 1216 + 32,
            ..Default::default()
        }
    }

    /// The record bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&[3, 3]);
        body.extend((0..32).map(|i| i as u8));
        body.push(self.session_id.len() as u8);
        body.extend_from_slice(&self.session_id);
        let suites = [0x13u8, 0x01, 0x13, 0x02, 0xc0, 0x2b, 0xc0, 0x2f];
        body.extend_from_slice(&(suites.len() as u16).to_be_bytes());
        body.extend_from_slice(&suites);
        body.extend_from_slice(&[1, 0]);

        let mut exts = Vec::new();
        for (kind, len) in &self.padding_extensions {
            ext(&mut exts, *kind, &alloc::vec![0x5a; *len]);
        }
        ext(&mut exts, 0, b"\x00\x0e\x00\x00\x0bexample.com");
        ext(&mut exts, 10, &[0, 4, 0x11, 0xec, 0, 0x1d]);
        if let Some(t) = &self.ticket {
            ext(&mut exts, 35, t);
        }
        let custom: Option<Vec<u8>> = self.versions.as_ref().map(|list| {
            let mut v = alloc::vec![(list.len() * 2) as u8];
            list.iter()
                .for_each(|x| v.extend_from_slice(&x.to_be_bytes()));
            v
        });
        let versions: &[u8] = match &custom {
            Some(v) => v,
            None if self.tls13 => &[4, 3, 4, 3, 3],
            None => &[2, 3, 3],
        };
        if !self.versions_after_key_share {
            ext(&mut exts, 43, versions);
        }
        ext(&mut exts, 13, &[0, 4, 4, 3, 8, 4]);
        let mut share = Vec::new();
        share.extend_from_slice(&((self.key_share_len + 4) as u16).to_be_bytes());
        share.extend_from_slice(&[0x11, 0xec]);
        share.extend_from_slice(&(self.key_share_len as u16).to_be_bytes());
        share.extend(core::iter::repeat_n(0x77, self.key_share_len));
        ext(&mut exts, 51, &share);
        if self.versions_after_key_share {
            ext(&mut exts, 43, versions);
        }
        ext(&mut exts, 45, &[1, 1]);
        if let Some(id) = &self.psk_identity {
            let mut psk = Vec::new();
            let identities = id.len() + 2 + 4;
            psk.extend_from_slice(&(identities as u16).to_be_bytes());
            psk.extend_from_slice(&(id.len() as u16).to_be_bytes());
            psk.extend_from_slice(id);
            psk.extend_from_slice(&[0, 0, 0x10, 0]);
            psk.extend_from_slice(&[0, 33, 32]);
            psk.extend(core::iter::repeat_n(0xb1, 32));
            ext(&mut exts, 41, &psk);
        }
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);

        let mut hs = alloc::vec![1u8];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = alloc::vec![22u8, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }
}
