//! `gateway tls issued add|del|list|count`: the issued session keys the datapath verifies
//! resumption offers against.

use std::path::Path;

use clap::Subcommand;

use super::{CommandError, Target, open};

/// `tls` subcommands.
#[derive(Debug, Subcommand)]
pub enum TlsAction {
    /// Issued session keys (filled by the TLS proxy; by hand for tests and other servers).
    Issued {
        /// Issued subcommand.
        #[command(subcommand)]
        action: IssuedAction,
    },
}

/// `tls issued` subcommands.
#[derive(Debug, Subcommand)]
pub enum IssuedAction {
    /// Publish the key of an issued session id, ticket or PSK identity: give the whole value (at
    /// least 16 bytes, 32 for a ticket or PSK identity, in hex); its key
    /// (`gateway_common::tls::issued_key`) is what the datapath matches offers against.
    Add {
        /// The whole issued value, in hex.
        #[arg(value_parser = parse_value)]
        value: IssuedBytes,
        /// What was issued: session-id, ticket or psk.
        #[arg(long, value_parser = parse_offer, default_value = "session-id")]
        kind: gateway_common::tls::Offer,
        /// Connections the key may hold in the tls-resumed class at once.
        #[arg(long, default_value_t = gateway_common::maps::DEFAULT_RESUME_LIMIT,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(gateway_common::maps::MAX_RESUME_LIMIT)))]
        limit: u32,
        /// Resumptions the key buys per minute beyond `--limit` at once.
        #[arg(long, default_value_t = gateway_common::maps::DEFAULT_RESUME_PER_MINUTE,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(gateway_common::maps::MAX_RESUME_PER_MINUTE)))]
        per_minute: u32,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// Withdraw the key of an issued value (as a session id's, a ticket's or a PSK identity's,
    /// whichever is published).
    Del {
        /// The whole issued value, in hex.
        #[arg(value_parser = parse_value)]
        value: IssuedBytes,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// List published keys.
    List {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Count published keys.
    Count {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
}

/// An issued kind by name (`gateway_common::tls::Offer::name`).
fn parse_offer(s: &str) -> Result<gateway_common::tls::Offer, String> {
    use gateway_common::tls::Offer;
    Offer::ISSUED
        .into_iter()
        .find(|o| o.name() == s)
        .ok_or_else(|| {
            let names: Vec<_> = Offer::ISSUED.iter().map(|o| o.name()).collect();
            format!("unknown kind {s:?}, expected one of {}", names.join(", "))
        })
}

/// An issued value's bytes, given in hex.
#[derive(Clone, Debug)]
pub struct IssuedBytes(Vec<u8>);

impl IssuedBytes {
    /// Its key as an issued value of kind `kind`.
    fn key(&self, kind: gateway_common::tls::Offer) -> Option<gateway_common::maps::IssuedKey> {
        gateway_common::tls::issued_key(kind, &self.0)
            .map(|key| gateway_common::maps::IssuedKey { key })
    }
}

/// An issued value given in hex.
fn parse_value(s: &str) -> Result<IssuedBytes, String> {
    let (min, max) = (
        gateway_common::tls::KEY_LEN,
        gateway_common::tls::MAX_OFFER as usize,
    );
    if s.len() < 2 * min || s.len() > 2 * max || !s.len().is_multiple_of(2) {
        return Err(format!(
            "need the whole issued value: an even number of hex digits, {} to {}, got {}",
            2 * min,
            2 * max,
            s.len()
        ));
    }
    // By bytes: a multi-byte character is simply not hex (slicing the string by byte offsets
    // would panic inside it).
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let value = s
        .as_bytes()
        .chunks(2)
        .enumerate()
        .map(|(i, pair)| match (digit(pair[0]), digit(pair[1])) {
            (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
            _ => Err(format!("not two hex digits at byte {}", 2 * i)),
        })
        .collect::<Result<Vec<u8>, _>>()?;
    Ok(IssuedBytes(value))
}

/// The resumptions per minute a published key buys, as the datapath applies it (0: the default).
fn per_minute(v: &gateway_common::maps::IssuedValue) -> u64 {
    60_000_000_000 / gateway_common::maps::resume_interval_ns(v.per_minute)
}

/// Runs a `tls` subcommand.
pub fn run(root: &Path, action: TlsAction) -> Result<(), CommandError> {
    match action {
        TlsAction::Issued { action } => issued(root, action),
    }
}

fn issued(root: &Path, action: IssuedAction) -> Result<(), CommandError> {
    use gateway_common::maps::IssuedValue;
    let hex = |k: &gateway_common::maps::IssuedKey| {
        k.key.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    match action {
        IssuedAction::Add {
            value,
            kind,
            limit,
            per_minute,
            target,
        } => {
            let key = value.key(kind).ok_or_else(|| {
                CommandError::Usage(format!(
                    "a {} must be at least {} bytes (its last {} are its tag)",
                    kind.name(),
                    gateway_common::tls::tag::MIN_TICKET,
                    gateway_common::tls::tag::TAIL_LEN
                ))
            })?;
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            maps.add_issued(
                key,
                IssuedValue {
                    kind: kind as u32,
                    limit,
                    per_minute,
                    issued_ns: crate::datapath::maps::monotonic_ns(),
                    ..Default::default()
                },
            )?;
            println!("published {} on {}", hex(&key), pd.iface);
        }
        IssuedAction::Del { value, target } => {
            use gateway_common::tls::Offer;
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let mut withdrew = None;
            for key in [Offer::SessionId, Offer::Ticket]
                .map(|k| value.key(k))
                .into_iter()
                .flatten()
            {
                if maps.remove_issued(&key)? {
                    withdrew = Some(key);
                }
            }
            let Some(key) = withdrew else {
                return Err(CommandError::Usage(format!(
                    "no key of that value is published on {}",
                    pd.iface
                )));
            };
            println!("withdrew {} on {}", hex(&key), pd.iface);
        }
        IssuedAction::List { target, json } => {
            let (_, maps) = open(root, target.iface.as_deref())?;
            let rows = maps.issued()?;
            let kind = |v: &IssuedValue| gateway_common::tls::Offer::from_id(v.kind & 0xff).name();
            // Who published it, and whether it still buys anything.
            let by = |v: &IssuedValue| {
                if v.kind & gateway_common::maps::ISSUED_WITHDRAWN != 0 {
                    "withdrawn"
                } else if v.kind & gateway_common::maps::ISSUED_BY_TAG != 0 {
                    "tag"
                } else if v.kind & gateway_common::maps::ISSUED_BY_KEY != 0 {
                    // Its ticket's MAC checked with the server's ticket key.
                    "key"
                } else if v.kind & gateway_common::maps::ISSUED_BY_SERVER != 0 {
                    // Learnt at the NIC from a server the gateway does not terminate.
                    "server"
                } else {
                    "daemon"
                }
            };
            if json {
                let v: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|(k, v)| {
                        serde_json::json!({
                            "key": hex(k), "kind": kind(v), "by": by(v), "expires": v.expires,
                            "limit": gateway_common::maps::resume_limit(v.limit),
                            "per_minute": per_minute(v),
                            "in_use": v.in_use,
                            "open": v.open,
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                for (k, v) in rows {
                    println!(
                        "{} {} by {} expires {} limit {} per-minute {} in-use {} open {}",
                        hex(&k),
                        kind(&v),
                        by(&v),
                        v.expires,
                        gateway_common::maps::resume_limit(v.limit),
                        per_minute(&v),
                        v.in_use,
                        v.open
                    );
                }
            }
        }
        IssuedAction::Count { target } => {
            let (_, maps) = open(root, target.iface.as_deref())?;
            println!("{}", maps.issued()?.len());
        }
    }
    Ok(())
}
