//! `gateway probe` run from the peer namespace, its JSON read back.

use crate::{gateway_bin, netns::TestNet};

/// Runs `gateway probe ARGS --json` in the peer namespace of `net`; the curve it printed.
/// Panics with the probe's stderr when it fails. The probe runs at nice -10, ahead of whatever
/// else keeps the machine busy: an instrument whose readings a compile beside it must not move.
pub fn run_probe(net: &TestNet, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new("nice")
        .args(["-n", "-10", "ip", "netns", "exec", &net.peer_ns])
        .arg(gateway_bin())
        .arg("probe")
        .args(args)
        .arg("--json")
        .output()
        .expect("gateway probe");
    assert!(
        out.status.success(),
        "gateway probe {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the probe's JSON")
}
