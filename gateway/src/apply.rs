//! The config written into an attachment's maps: its services, its policies and its datapath
//! settings. The daemon applies it at start and on every reload.

use std::collections::BTreeSet;

use gateway_common::{
    Class,
    maps::{DatapathConfig, SIP_FAMILY_INVITE, SIP_FAMILY_OTHER, ServiceKey},
    reasons::Owner,
};

use tracing::warn;

use crate::{
    config::Config,
    datapath::maps::{Maps, MapsError},
    tls::server_keys::{self, KeyFileError},
};

/// Writes the config's services, policies and datapath settings into one attachment's maps.
/// Services not in the config are removed; classes without a policy become unlimited. A class an
/// operator pinned keeps the operator's limits, and a class the controller moves (and will go on
/// moving under this config) keeps the controller's.
pub fn apply(maps: &mut Maps, cfg: &Config) -> Result<(), MapsError> {
    let services = cfg.all_services();
    let wanted: BTreeSet<ServiceKey> = services.iter().map(|(k, _)| *k).collect();
    for (key, _) in maps.services()? {
        if !wanted.contains(&key) {
            maps.remove_service(key)?;
        }
    }
    for (key, value) in services {
        maps.add_service(key, value)?;
    }
    learn(maps, cfg)?;
    let controlled = |class: Class| {
        cfg.controller.classes.contains_key(&class)
            || class
                .led_by()
                .is_some_and(|l| cfg.controller.classes.contains_key(&l))
    };
    for class in Class::ALL.into_iter().filter(|c| c.is_limitable()) {
        let current = maps.policy(class)?;
        if current.pinned() || (current.owned_by(Owner::Controller) && controlled(class)) {
            continue;
        }
        maps.set_policy(class, cfg.policy.of(class).to_map())?;
    }
    // The limits of sip-original's method families are the controller's alone: without it,
    // the class's own limit is the only one in force (none left from an earlier run).
    if !controlled(Class::SipOriginal) {
        for index in [SIP_FAMILY_INVITE, SIP_FAMILY_OTHER] {
            maps.set_sip_family_limit(index, 0)?;
        }
    }
    let dp = maps.config()?;
    maps.set_config(DatapathConfig {
        flags: cfg.datapath.flags(),
        ..dp
    })?;
    Ok(())
}

/// Writes the terms of every port whose sessions the NIC learns (a tls service's `server:`),
/// with the NIC's wall clock as of now, and removes those of ports no longer learnt. Run at
/// start, on every reload and every second or so (`learn_clock`).
pub fn learn(maps: &mut Maps, cfg: &Config) -> Result<(), MapsError> {
    let clock_ns = crate::datapath::maps::wall_clock_offset_ns();
    let wanted = cfg.learnt_ports();
    for (port, _) in maps.learn_terms()? {
        if !wanted.iter().any(|(p, _)| *p == port) {
            maps.remove_learn_terms(port)?;
        }
    }
    for (port, server) in &wanted {
        maps.set_learn_terms(*port, server.terms(clock_ns))?;
    }
    ticket_keys(maps, cfg, &mut |port, e| {
        warn!(port, error = %e, "cannot read the server's ticket keys; keeping those held");
    })?;
    Ok(())
}

/// Makes the ticket keys the NIC holds those of the servers' key files now (a tls service's
/// `server: {ticket_keys}`); a port whose files cannot be read keeps what it held (told to
/// `unreadable`). When a key was removed, every key published on a ticket's MAC goes with it
/// (`Maps::remove_issued_by_key`). Returns whether anything changed.
pub fn ticket_keys(
    maps: &mut Maps,
    cfg: &Config,
    unreadable: &mut dyn FnMut(u16, &KeyFileError),
) -> Result<bool, MapsError> {
    let mut ports: BTreeSet<u16> = maps.ticket_keys()?.iter().map(|(k, _)| k.port).collect();
    let (mut written, mut removed) = (0, 0);
    for (port, server) in cfg.learnt_ports() {
        let Some(files) = &server.ticket_keys else {
            continue;
        };
        ports.remove(&port);
        match server_keys::read(files.format, &files.files) {
            Ok(keys) => {
                let keys: Vec<_> = keys.iter().map(|k| k.to_map(port)).collect();
                let (w, r) = maps.set_ticket_keys(port, &keys)?;
                written += w;
                removed += r;
            }
            Err(e) => unreadable(port, &e),
        }
    }
    // Ports with keys no longer configured.
    for port in ports {
        removed += maps.set_ticket_keys(port, &[])?.1;
    }
    if removed > 0 {
        maps.remove_issued_by_key()?;
    }
    Ok(written + removed > 0)
}
