//! Liveness and readiness, as supervisors and load balancers ask for them: `/healthz` answers
//! while the process serves; `/readyz` answers 200 only when every check passes (each configured
//! interface's program attached in the mode asked for, its maps of this build's layout, every
//! proxy listener accepting, the controller's last interval recent), else 503 with the reasons.

use std::sync::Arc;

use crate::datapath::bpfsys::link_ifindex;

/// One readiness check: `Err` says why not, in an operator's words.
pub type Check = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The outcome of every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Every check passed.
    pub ready: bool,
    /// One line per failed check (empty when ready).
    pub reasons: Vec<String>,
}

impl Readiness {
    /// Runs `checks`.
    pub fn of(checks: &[Check]) -> Self {
        let reasons: Vec<String> = checks.iter().filter_map(|c| c().err()).collect();
        Readiness {
            ready: reasons.is_empty(),
            reasons,
        }
    }

    /// The body `/readyz` answers with.
    pub fn body(&self) -> String {
        if self.ready {
            "ready\n".to_string()
        } else {
            let mut out = "not ready:\n".to_string();
            for r in &self.reasons {
                out += &format!("- {r}\n");
            }
            out
        }
    }
}

/// Shared checks (the daemon adds them as it starts its parts).
pub type Checks = Arc<Vec<Check>>;

/// Whether the link pinned in `pd` is bound to its interface; why not, in the words `/readyz`
/// and `gateway status` both use.
pub fn link_bound(pd: &crate::datapath::pins::PinDir) -> Result<(), String> {
    match link_ifindex(&pd.link()) {
        Ok(0) => Err(format!(
            "{}: the program is detached (its link is bound to no interface)",
            pd.iface
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{}: no pinned link ({e})", pd.iface)),
    }
}

/// An attachment's own readiness (what `gateway status` checks): its link bound, its maps of
/// this build's layout. Maps another build laid out that this one carries over on its start
/// are named as such (the datapath runs the other build until then).
pub fn attachment_ready(pd: &crate::datapath::pins::PinDir) -> Result<(), String> {
    link_bound(pd)?;
    let grown = crate::datapath::pinned_layout::grown(pd, crate::EBPF_OBJECT)
        .map_err(|e| format!("{}: {e}", pd.iface))?;
    if grown.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = grown.iter().map(|g| g.map).collect();
    Err(format!(
        "{}: {} laid out by another build: this build's start (gateway run, gateway attach) \
         carries {} over",
        pd.iface,
        names.join(", "),
        if names.len() == 1 { "it" } else { "them" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_check_passes_and_the_body_says_why_not() {
        let ok: Check = Box::new(|| Ok(()));
        let down: Check = Box::new(|| Err("eth0: the program is detached".into()));
        let r = Readiness::of(&[ok]);
        assert!(r.ready);
        assert_eq!(r.body(), "ready\n");
        let ok: Check = Box::new(|| Ok(()));
        let r = Readiness::of(&[ok, down]);
        assert!(!r.ready);
        assert_eq!(r.body(), "not ready:\n- eth0: the program is detached\n");
    }

    #[test]
    fn a_missing_pin_is_an_error_not_a_detached_link() {
        assert!(link_ifindex(std::path::Path::new("/nonexistent/gateway/link")).is_err());
    }
}
