//! `gateway policy show|set|clear|unpin`: per-class admission limits, and who owns them.
//!
//! A class the daemon's controller moves cannot be set by hand without `--pin`: the controller
//! would move it again a moment later. Pinned, it is the operator's until `policy unpin`.

use std::path::Path;

use clap::Subcommand;
use gateway_common::{
    Class,
    maps::ClassPolicy,
    policy::{Policy, Refuse},
    reasons::Owner,
};

use super::{CommandError, Target, open};
use crate::{
    config,
    datapath::maps::{MapsError, monotonic_ns},
    output,
};

/// `policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Show every class's limits and backlog.
    Show {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Set limits of a class; limits not given stay as they are.
    Set {
        /// Class name.
        #[arg(value_parser = parse_limitable_class)]
        class: Class,
        /// Maximum backlog (admitted minus completed).
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=gateway_common::policy::MAX_BACKLOG))]
        backlog: Option<u64>,
        /// Sustained admissions per second.
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=gateway_common::policy::MAX_RATE))]
        rate: Option<u64>,
        /// Admissions allowed in a burst above the rate.
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=gateway_common::policy::MAX_BURST))]
        burst: Option<u64>,
        /// How long an admitted unit may go unanswered before it expires (`500ms`, `10s`; at
        /// most 1h).
        #[arg(long, value_parser = crate::config::parse_unit_timeout)]
        timeout: Option<crate::proxy::config::Span>,
        /// What a refusal gets: `drop` (silence) or `reject` (a TCP reset, a SIP 503 from the NIC).
        #[arg(long, value_parser = parse_refuse)]
        refuse: Option<Refuse>,
        /// Replies per second for refusals, all CPUs together.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=gateway_common::policy::MAX_REPLY_RATE))]
        reply_rate: Option<u64>,
        /// Seconds a SIP 503 asks the client to wait (`Retry-After`).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(gateway_common::policy::MAX_RETRY_AFTER)))]
        retry_after: Option<u32>,
        /// Fix the class: the controller leaves it alone until `policy unpin`.
        #[arg(long)]
        pin: bool,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// Remove every limit of a class (pinned: the controller leaves it alone).
    Clear {
        /// Class name.
        #[arg(value_parser = parse_limitable_class)]
        class: Class,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// Hand a pinned class back to the controller, which starts from its current limits.
    Unpin {
        /// Class name.
        #[arg(value_parser = parse_limitable_class)]
        class: Class,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
}

/// The policy an operator sets: stamped with its owner and time, pinned when asked.
fn by_operator(p: Policy, pin: bool) -> ClassPolicy {
    let mut m = p.to_map();
    m.owner = Owner::Operator.id();
    m.changed_ns = monotonic_ns();
    if pin {
        m.set_pinned(true);
    }
    m
}

/// A refusal action, by name.
fn parse_refuse(s: &str) -> Result<Refuse, String> {
    Refuse::from_name(s).ok_or_else(|| format!("'{s}' is not one of: drop, reject"))
}

/// A class that can be limited, by name.
fn parse_limitable_class(s: &str) -> Result<Class, String> {
    let class = Class::from_name(s).ok_or_else(|| config::unknown_class(s))?;
    if class.is_limitable() {
        Ok(class)
    } else {
        Err(config::unlimitable_class(class))
    }
}

/// Runs a `policy` subcommand.
pub fn run(root: &Path, action: PolicyAction) -> Result<(), CommandError> {
    match action {
        PolicyAction::Show { target, json } => {
            let (_, maps) = open(root, target.iface.as_deref())?;
            let state = maps.class_state()?;
            let rows = Class::ALL
                .into_iter()
                .filter(|c| c.is_limitable())
                .map(|c| Ok((c, maps.policy(c)?, state[c.id() as usize])))
                .collect::<Result<Vec<_>, MapsError>>()?;
            let families = sip_families(&maps)?;
            print!("{}", output::policies(&rows, &families, json));
            if json {
                println!();
            }
        }
        PolicyAction::Set {
            class,
            backlog,
            rate,
            burst,
            timeout,
            refuse,
            reply_rate,
            retry_after,
            pin,
            target,
        } => {
            let limits =
                backlog.is_some() || rate.is_some() || burst.is_some() || timeout.is_some();
            let replies = refuse.is_some() || reply_rate.is_some() || retry_after.is_some();
            if !limits && !replies {
                return Err(CommandError::Usage(
                    "policy set needs at least one of --backlog, --rate, --burst, --timeout, \
                     --refuse, --reply-rate, --retry-after"
                        .into(),
                ));
            }
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let current = maps.policy(class)?;
            if !limits && !pin {
                // How refusals are answered is no limit the controller moves: it changes alone,
                // and the limits keep their owner.
                let p = Policy::from_map(&current).overlay(Policy {
                    refuse,
                    reply_rate,
                    retry_after,
                    ..Policy::UNLIMITED
                });
                maps.set_policy(class, current.with_replies_of(&p.to_map()))?;
                println!(
                    "{} on {}: {}",
                    class.name(),
                    pd.iface,
                    output::describe_policy(&p)
                );
                return Ok(());
            }
            let pinned = current.pinned();
            if current.owned_by(Owner::Controller) && !pinned && !pin {
                return Err(CommandError::Usage(format!(
                    "{} on {} is moved by the controller ({}): pass --pin to fix it by hand, \
                     or change the controller's bounds in the config",
                    class.name(),
                    pd.iface,
                    current.reason_name()
                )));
            }
            let p = Policy::from_map(&current).overlay(Policy {
                backlog,
                rate,
                burst,
                timeout: timeout.map(|t| t.0),
                refuse,
                reply_rate,
                retry_after,
            });
            if p.burst.is_some() && p.rate.is_none() {
                return Err(CommandError::Usage(format!(
                    "--burst needs a rate: class {} has none, pass --rate",
                    class.name()
                )));
            }
            let pin = pin || pinned;
            maps.set_policy(class, by_operator(p, pin))?;
            clear_family_limits(&mut maps, class)?;
            println!(
                "{} on {}: {}{}",
                class.name(),
                pd.iface,
                output::describe_policy(&p),
                if pin { " (pinned)" } else { "" }
            );
        }
        PolicyAction::Clear { class, target } => {
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let pin = maps.policy(class)?.owned_by(Owner::Controller);
            maps.set_policy(class, by_operator(Policy::UNLIMITED, pin))?;
            clear_family_limits(&mut maps, class)?;
            println!(
                "{} on {}: unlimited{}",
                class.name(),
                pd.iface,
                if pin { " (pinned)" } else { "" }
            );
        }
        PolicyAction::Unpin { class, target } => {
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let mut p = maps.policy(class)?;
            if !p.pinned() {
                return Err(CommandError::Usage(format!(
                    "{} on {} is not pinned",
                    class.name(),
                    pd.iface
                )));
            }
            p.set_pinned(false);
            p.changed_ns = monotonic_ns();
            maps.set_policy(class, p)?;
            println!(
                "{} on {}: unpinned (a running controller takes it from here)",
                class.name(),
                pd.iface
            );
        }
    }
    Ok(())
}

/// `sip-original`'s method families, as the datapath holds them; none when the pinned maps
/// are an older build's without them.
fn sip_families(maps: &crate::datapath::maps::Maps) -> Result<Vec<output::FamilyRow>, MapsError> {
    use gateway_common::maps::{SIP_FAMILY_INVITE, SIP_FAMILY_OTHER};
    let mut rows = Vec::new();
    for (method, index) in [("invite", SIP_FAMILY_INVITE), ("other", SIP_FAMILY_OTHER)] {
        match maps.sip_family(index) {
            Ok((counts, limit)) => rows.push(output::FamilyRow {
                method,
                backlog: counts.backlog(),
                limit,
            }),
            Err(MapsError::Open { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
    }
    Ok(rows)
}

/// An operator's limits for `class` are the only ones in force: the limits a controller set
/// for `sip-original`'s method families go with them.
fn clear_family_limits(
    maps: &mut crate::datapath::maps::Maps,
    class: Class,
) -> Result<(), MapsError> {
    use gateway_common::maps::{SIP_FAMILY_INVITE, SIP_FAMILY_OTHER};
    if class != Class::SipOriginal {
        return Ok(());
    }
    for index in [SIP_FAMILY_INVITE, SIP_FAMILY_OTHER] {
        match maps.set_sip_family_limit(index, 0) {
            Ok(()) | Err(MapsError::Open { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
