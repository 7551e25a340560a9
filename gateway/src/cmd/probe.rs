//! `gateway probe`: the mini-flash-crowd probe (`crate::probe`) against a target the operator
//! names: the curve as a table or JSON, its tipping point, and the policy it suggests.

use std::{net::SocketAddr, sync::Arc};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::CommandError;
use crate::probe::{self, Client, Plan, ProbeKind, TlsSettings};

/// `gateway probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The one address to probe (IP:port); nothing else is sent anywhere.
    #[arg(long)]
    pub target: SocketAddr,
    /// What each client sends.
    #[arg(long, value_enum)]
    pub kind: ProbeKind,
    /// First crowd size (the base stage).
    #[arg(long, default_value_t = 5)]
    pub start: u32,
    /// Clients added per stage.
    #[arg(long, default_value_t = 5)]
    pub step: u32,
    /// Largest crowd.
    #[arg(long, default_value_t = 50)]
    pub max: u32,
    /// Synchronized crowds per stage.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Rise of the median response time over the base stage's that stops the probe.
    #[arg(long, default_value = "100ms")]
    pub threshold: crate::proxy::config::Span,
    /// Per request.
    #[arg(long, default_value = "5s")]
    pub timeout: crate::proxy::config::Span,
    /// For the whole probe.
    #[arg(long, default_value = "300s")]
    pub deadline: crate::proxy::config::Span,
    /// TLS: PEM certificates to trust.
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
    /// TLS: accept any certificate (the probe measures time, not identity).
    #[arg(long)]
    pub insecure: bool,
    /// TLS: the server name to send [default: the target's address].
    #[arg(long)]
    pub server_name: Option<String>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
    /// Print the class limits (and controller bounds) the curve implies, as config YAML.
    #[arg(long)]
    pub suggest_policy: bool,
    /// Draw the curve (median and p90 by crowd, the tipping point marked) into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<std::path::PathBuf>,
}

/// Runs the probe and prints its curve.
pub fn run(args: ProbeArgs) -> Result<(), CommandError> {
    let plan = Plan {
        kind: args.kind,
        target: args.target,
        start: args.start,
        step: args.step,
        max: args.max,
        rounds: args.rounds,
        threshold: args.threshold.0,
        timeout: args.timeout.0,
        deadline: args.deadline.0,
    };
    plan.check().map_err(CommandError::Usage)?;
    let tls = TlsSettings {
        ca: args.ca,
        insecure: args.insecure,
        server_name: args
            .server_name
            .unwrap_or_else(|| args.target.ip().to_string()),
    };
    let client =
        Client::new(plan.kind, plan.target, plan.timeout, &tls).map_err(CommandError::Usage)?;
    let stages = plan.crowds().count() as u64;
    let bar = ProgressBar::new(stages).with_style(
        ProgressStyle::with_template("{bar:30} stage {pos}/{len} {msg}").expect("a valid template"),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CommandError::Usage(format!("tokio runtime: {e}")))?;
    let curve = runtime
        .block_on(probe::run(&plan, Arc::new(client), |s| {
            bar.set_message(format!(
                "crowd {}: median {:.1} ms, {} failed",
                s.crowd, s.median_ms, s.failed
            ));
            bar.inc(1);
        }))
        .map_err(|e| CommandError::Usage(format!("probing {}: {e}", plan.target)))?;
    bar.finish_and_clear();
    if let Some(path) = &args.plot {
        probe::plot(&curve, path).map_err(|e| CommandError::Usage(e.to_string()))?;
        eprintln!("plot: {}", path.display());
    }
    if args.json {
        let mut v = serde_json::to_value(&curve).expect("serializable");
        if args.suggest_policy {
            v["suggested_policy"] = probe::suggest_policy(&curve).into();
        }
        println!("{v}");
    } else {
        print!("{}", probe::table(&curve));
        if args.suggest_policy {
            match probe::suggest_policy(&curve) {
                Some(yaml) => print!("\n{yaml}"),
                None => println!("\nno stable stage: nothing to suggest"),
            }
        }
    }
    Ok(())
}
