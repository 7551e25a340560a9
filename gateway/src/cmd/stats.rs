//! `gateway stats`: per-class, parser and TLS counters, once or every few seconds.

use std::{path::Path, thread, time::Duration};

use clap::Args;

use super::{CommandError, Target, open};
use crate::{
    datapath::loader,
    output::{Rates, StatsView},
};

/// `gateway stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Which attachment.
    #[command(flatten)]
    pub target: Target,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
    /// Print again every SECS seconds, with each class's rates since the previous print.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub watch: Option<u64>,
    /// With --watch: stop after N prints.
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,
}

/// Shows the counters.
pub fn run(root: &Path, args: StatsArgs) -> Result<(), CommandError> {
    let StatsArgs {
        target,
        json,
        watch,
        count,
    } = args;
    let (pd, maps) = open(root, target.iface.as_deref())?;
    let mut printed = 0u64;
    let mut previous: Option<(std::time::Instant, Vec<gateway_common::maps::ClassStats>)> = None;
    loop {
        let info = loader::info(&pd)?;
        let classes = maps.class_stats()?;
        let state = maps.class_state()?;
        let counters = maps.counters()?;
        let tls = maps.tls_counters()?;
        let latency = gateway_common::Class::ALL
            .into_iter()
            .map(|c| maps.latency(c))
            .collect::<Result<Vec<_>, _>>()?;
        let policies = gateway_common::Class::ALL
            .into_iter()
            .filter(|c| c.is_limitable())
            .map(|c| Ok((c, maps.policy(c)?)))
            .collect::<Result<Vec<_>, crate::datapath::maps::MapsError>>()?;
        let read_at = std::time::Instant::now();
        let rates = previous.as_ref().map(|(at, before)| {
            Rates::between(before, &classes, read_at.duration_since(*at).as_secs_f64())
        });
        let view = StatsView {
            time: std::time::SystemTime::now(),
            rates: rates.as_deref(),
            info: &info,
            classes: &classes,
            state: &state,
            counters: &counters,
            tls: &tls,
            latency: &latency,
            policies: &policies,
        };
        if json {
            println!("{}", view.json());
        } else {
            print!("{}", view.table());
        }
        printed += 1;
        previous = Some((read_at, classes.to_vec()));
        match watch {
            Some(secs) if count.is_none_or(|n| printed < n) => {
                thread::sleep(Duration::from_secs(secs));
            }
            _ => break,
        }
    }
    Ok(())
}
