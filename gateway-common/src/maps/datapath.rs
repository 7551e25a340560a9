//! The datapath-wide entries: its settings (`DP_CONFIG`) and its parser counters
//! (`DP_COUNTERS`).

super::pinned_maps! {
    /// Per-CPU parser counters ([`crate::maps::DatapathCounters`]).
    DP_COUNTERS: u32 => DatapathCounters,
    /// Datapath-wide settings ([`crate::maps::DatapathConfig`]).
    DP_CONFIG: u32 => DatapathConfig,
    /// The key this attachment's programs mix into the metadata tags the XDP program hands a
    /// frame to the finishing program with (XORed into the tag word), its one entry: drawn at
    /// random by the loader when it attaches the finishing program, and kept across restarts
    /// and upgrades. A veth carries a frame's metadata over to its peer, so the finishing
    /// program trusts only tags made with this key: a frame another host's gateway (or a
    /// forger) tagged is not handed over. 0 (not drawn): nothing is handed over.
    HANDOVER_KEY: u32 => u32,
    /// The XDP hook's jump table (index 0: the SIP program). Pinned: the kernel empties a program
    /// array when its last userspace reference goes away, and a pin is one.
    XDP_JUMP: u32 => u32,
    /// The TC hook's jump table (index 0: the SIP program, 1: the reply program), pinned
    /// likewise.
    TC_JUMP: u32 => u32,
}

/// [`DatapathConfig::flags`]: drop IP fragments instead of passing them.
pub const CONFIG_DROP_FRAGMENTS: u64 = 1 << 0;
/// [`DatapathConfig::flags`]: drop packets whose headers cannot be parsed within the bounds
/// instead of passing them.
pub const CONFIG_DROP_UNPARSEABLE: u64 = 1 << 1;

/// [`DatapathConfig::flags`]: judge TLS hellos without asking whether the kernel has their
/// connection. Only for test fixtures that replay synthetic frames with no socket behind them
/// (BPF_PROG_TEST_RUN); the loader and the config never set it.
pub const CONFIG_TRUST_UNCONNECTED: u64 = 1 << 2;

/// [`DatapathConfig::finisher`]: the finishing program is attached.
pub const FINISHER_ATTACHED: u32 = 1 << 0;
/// [`DatapathConfig::finisher`]: the XDP reply program hands its SIP 503s to the finishing
/// program, which sends them out of the device (`bpf_redirect` to its egress), rather than
/// sending them itself with XDP_TX. For devices whose XDP_TX may not deliver: a veth delivers
/// what XDP_TX sends only to a peer that runs NAPI (an XDP program of its own), which a
/// container host's side of a pod does not.
pub const FINISHER_SENDS_REPLIES: u32 = 1 << 1;

/// How the program is attached, as recorded by the loader in [`DatapathConfig::attach_mode`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Not recorded.
    Unknown = 0,
    /// Native (driver) XDP.
    Native = 1,
    /// Generic (SKB) XDP.
    Generic = 2,
    /// TC ingress (tcx).
    Tc = 3,
}

impl AttachMode {
    /// The mode with this numeric id.
    pub const fn from_id(id: u32) -> AttachMode {
        match id {
            1 => AttachMode::Native,
            2 => AttachMode::Generic,
            3 => AttachMode::Tc,
            _ => AttachMode::Unknown,
        }
    }

    /// Name used by the CLI, status output and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            AttachMode::Unknown => "unknown",
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Tc => "tc",
        }
    }
}

/// Datapath-wide settings, the single entry of the `DP_CONFIG` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathConfig {
    /// `CONFIG_*` bits.
    pub flags: u64,
    /// The [`AttachMode`] the loader used (informational; the program does not read it).
    pub attach_mode: u32,
    /// Interface index the program is attached to (informational).
    pub ifindex: u32,
    /// PID of the `gateway run` daemon serving this attachment; 0 when none runs (`gateway
    /// reload` signals it).
    pub daemon_pid: u32,
    /// Reloads the daemon applied.
    pub reloads: u32,
    /// Reloads the daemon refused (the config was bad; nothing changed).
    pub reloads_refused: u32,
    /// `FINISHER_*` bits. [`FINISHER_ATTACHED`] when the loader attached the finishing program
    /// (`programs::TC_FINISH`) at this XDP attachment's TC ingress: the XDP reply program then
    /// hands a refused TCP segment to the stack as the server's reset, and the finishing
    /// program sends the client's; without it, the XDP program resets the client alone
    /// (XDP_TX). [`FINISHER_SENDS_REPLIES`] too where XDP_TX may not deliver (native XDP on a
    /// veth): SIP 503s are handed to the finishing program, which sends them out.
    pub finisher: u32,
}

crate::counters! {
    /// Parser counters, the single entry of the per-CPU `DP_COUNTERS` array. Touched only when a
    /// packet has something to count here (the total is the sum of the per-class packet counts).
    pub struct DatapathCounters {
        /// Not IPv4 or IPv6 (ARP, LLDP, ...), passed.
        pub not_ip: u64,
        /// Frames that ended inside a header.
        pub truncated: u64,
        /// Headers with impossible fields (IPv4 IHL < 5, TCP data offset < 5, wrong IP version).
        pub malformed: u64,
        /// IPv4 or IPv6 fragments. A first fragment is also classified (it carries the ports and
        /// the start of the message); later ones are passed or dropped by policy.
        pub fragments: u64,
        /// Headers beyond the parser's bounds (too many VLAN tags or IPv6 extension headers, ESP).
        pub unparseable: u64,
        /// Packets dropped by the fragment or unparseable policy.
        pub policy_dropped: u64,
        /// Packets refused whatever the policy says, since they may reach a protected service
        /// and cannot be judged: IPv6 header chains past the parser's bounds, first fragments
        /// that end before their ports.
        pub unjudgeable: u64,
        /// Frames carrying at least one VLAN tag.
        pub vlan: u64,
        /// IPv6 packets.
        pub ipv6: u64,
        /// IPv4 packets carrying options.
        pub ipv4_options: u64,
        /// Units refused because their pending table was full.
        pub pending_full: u64,
        /// SIP requests that claimed an exemption (ACK, CANCEL, BYE, a To tag) for a dialog or
        /// transaction the server never made: judged as originals.
        pub sip_unearned: u64,
        /// SIP 503s sent from the NIC for refused requests.
        pub sip_replies_sent: u64,
        /// Refused SIP requests the class would answer that got no 503: the frame was not one the
        /// datapath answers (IP options, extension headers, headers past the parser's reach, a
        /// reply that would be longer than the request).
        pub sip_replies_withheld: u64,
        /// ACKs for the NIC's own 503s, absorbed (the server never sent what they acknowledge).
        pub sip_acks_absorbed: u64,
        /// Requests of a dialog that had spent its exemption (past its ceiling of exempt
        /// requests, or idle too long): judged as originals.
        pub sip_dialog_spent: u64,
        /// Dialogs ended by the server's answer to their BYE.
        pub sip_dialogs_ended: u64,
        /// Copies of a SIP request whose original was refused (never admitted): judged as
        /// originals again, not as retransmissions.
        pub sip_copies_of_refused: u64,
        /// Copies of an admitted SIP request past `MAX_TXN_COPIES` (more than an RFC 3261
        /// client sends): refused.
        pub sip_copies_over: u64,
        /// TCP segments answered from the NIC (a SYN-ACK, a reset) whose IPv4 options or IPv6
        /// extension headers were taken out of the frame first: an answer carries none.
        pub ip_options_removed: u64,
        /// SYNs to a port in SYN-cookie mode that could not be answered from the NIC (headers
        /// past the bounds a reply is made within): dropped, never passed to the kernel
        /// unjudged.
        pub syns_unanswerable: u64,
    }
}
