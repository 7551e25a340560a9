//! The eBPF object's programs, by name, and the jump tables their ingress programs tail call:
//! each slot beside the programs that fill it on each hook, so that the loader's tables are
//! derived from here ([`Jump::program`]) and a new slot is one variant with its programs.

use crate::maps::names;

/// The XDP ingress classifier.
pub const XDP: &str = "gateway_xdp";
/// The same classifier as a TC ingress program (fallback hook).
pub const TC_INGRESS: &str = "gateway_tc_ingress";
/// The TC egress program: completions of TLS connections and SIP transactions (the server's
/// answers), and SIP service times.
pub const TC_EGRESS: &str = "gateway_tc_egress";
/// The SIP classifier of the XDP hook, reached by tail call from [`XDP`].
pub const XDP_SIP: &str = "gateway_xdp_sip";
/// The SIP classifier of the TC hook, reached by tail call from [`TC_INGRESS`].
pub const TC_SIP: &str = "gateway_tc_sip";
/// The reply program of the XDP hook (a reset or a 503 to a refused client), reached by
/// tail call from [`XDP`] and [`XDP_SIP`].
pub const XDP_REPLY: &str = "gateway_xdp_reply";
/// The reply program of the TC hook, reached by tail call from [`TC_INGRESS`] and
/// [`TC_SIP`].
pub const TC_REPLY: &str = "gateway_tc_reply";
/// The finishing program at the TC ingress of an XDP attachment: for a refused segment the
/// XDP program turned into the server's reset, it sends the client its reset (a copy) and
/// passes the server's on.
pub const TC_FINISH: &str = "gateway_tc_finish";

/// A bare `XDP_PASS` program, the baseline of the per-packet cost benchmark.
pub const XDP_BARE_PASS: &str = "gateway_bare_pass";
/// A bare `XDP_DROP` program, the baseline of a refusal in the throughput benchmark.
pub const XDP_BARE_DROP: &str = "gateway_bare_drop";
/// The benchmark's fresh-packet program: writes the run's number into its packet
/// (`BenchFresh`) and jumps to the XDP classifier, so that repeated runs are new
/// connections or transactions. Attached nowhere.
pub const XDP_BENCH_FRESH: &str = "gateway_bench_fresh";
/// The sweep program: ends expired units now. Attached nowhere; the daemon runs it by
/// `BPF_PROG_TEST_RUN`.
pub const SWEEP: &str = "gateway_sweep";

/// The hooks an ingress program runs at, each with a jump table of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// XDP ([`XDP`] and the programs it tail calls).
    Xdp,
    /// TC ingress ([`TC_INGRESS`] and the programs it tail calls).
    Tc,
}

impl Hook {
    /// Both hooks.
    pub const ALL: [Hook; 2] = [Hook::Xdp, Hook::Tc];

    /// The name of its jump table (`XDP_JUMP`, `TC_JUMP`).
    pub const fn jump_table(self) -> &'static str {
        match self {
            Hook::Xdp => names::XDP_JUMP,
            Hook::Tc => names::TC_JUMP,
        }
    }
}

/// The slots of a hook's jump table ([`Hook::jump_table`]): the programs the ingress program
/// tail calls, each verified on its own.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jump {
    /// The SIP classifier.
    Sip = 0,
    /// The reply program: a refused packet answered.
    Reply = 1,
}

impl Jump {
    /// Every slot, by index.
    pub const ALL: [Jump; 2] = [Jump::Sip, Jump::Reply];

    /// Its index in the jump table.
    #[inline(always)]
    pub const fn slot(self) -> u32 {
        self as u32
    }

    /// The program in this slot of `hook`'s table.
    pub const fn program(self, hook: Hook) -> &'static str {
        match (self, hook) {
            (Jump::Sip, Hook::Xdp) => XDP_SIP,
            (Jump::Sip, Hook::Tc) => TC_SIP,
            (Jump::Reply, Hook::Xdp) => XDP_REPLY,
            (Jump::Reply, Hook::Tc) => TC_REPLY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_its_index_and_every_slot_of_every_hook_has_a_program_of_its_own() {
        let mut seen = alloc::vec::Vec::new();
        for (i, j) in Jump::ALL.iter().enumerate() {
            assert_eq!(j.slot(), i as u32);
            for hook in Hook::ALL {
                seen.push(j.program(hook));
            }
        }
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n, "a program fills two slots");
        assert_ne!(Hook::Xdp.jump_table(), Hook::Tc.jump_table());
    }

    #[test]
    fn the_slots_are_the_ones_earlier_builds_filled() {
        // Pinned jump tables outlive a build: an upgrade replaces each slot's program in place.
        assert_eq!((Jump::Sip.slot(), Jump::Reply.slot()), (0, 1));
    }
}
