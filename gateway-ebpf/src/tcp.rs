//! The TCP layer: what every TCP service does at the NIC before and beside judging its first
//! segment, kept apart from what it judges.
//!
//! - [`lookup`]: whether the kernel has a connection (or a listener) for a segment's 4-tuple,
//!   and the segment's key ([`flow_key`]) and socket tuple ([`fill_tuple`]);
//! - [`cookie`]: SYN cookies answered at the NIC, and the cookie a first data segment
//!   acknowledges checked there;
//! - [`held`]: a first segment held back while the rest of what it starts arrives, and joined
//!   with the segment that admitted it, for the kernel;
//! - [`send`]: the answers the reply program sends for the layer (a SYN-ACK, the
//!   acknowledgement of a held segment) or the join;
//! - [`handoff`]: a connection the NIC answered handed to its listener with a request socket.
//!
//! A TCP service drives the layer from its own classifier through [`TcpService`]: the layer's
//! part of its per-CPU scratch ([`TcpScratch`]), its counters (the layer counts
//! [`TcpEvent`]s, the service says where), and what the layer tells it (a held first segment
//! joined, so its connection is the kernel's). How a first segment is judged stays the
//! service's: TLS (`crate::tls::tls_packet`) decides a hello; the layer only holds, answers,
//! joins and hands over. Nothing here imports a service.
//!
//! A second service (SIP over TCP, say) plugs in without touching TLS. Its part, with the
//! signatures it meets:
//!
//! ```text
//! // sip.rs: its scratch holds the layer's, and its type is a TcpService.
//! struct SipTcpScratch { tcp: TcpScratch, /* its own parser state */ }
//! struct SipTcp;
//! impl TcpService for SipTcp {
//!     type Scratch = SipTcpScratch;
//!     fn scratch() -> Option<*mut SipTcpScratch>;          // its per-CPU map's slot
//!     fn tcp(s: &mut SipTcpScratch) -> &mut TcpScratch;     // &mut s.tcp
//!     fn count(event: TcpEvent);                            // into its own counters
//!     fn joined(s: &mut SipTcpScratch, v4: bool);           // its flow: the kernel's now
//! }
//! // Its classifier, on a port of its own, calls what it needs of the layer:
//! flow_key(b, pkt, &mut s.tcp.key, false) -> bool;
//! lookup::kernel_has(ctx, b, pkt, &mut s.tcp, Wanted::Connection) -> bool;
//! cookie::answer_syn(ctx, pkt, &mut s.tcp) -> Action;       // a SYN, in SYN-cookie mode
//! cookie::check(ctx, pkt, &mut s.tcp) -> bool;              // its first data segment
//! held::keep::<_, SipTcp>(ctx, pkt, &s.tcp.key, payload_len); // a request in two segments
//! cookie::hold(&mut s.tcp, first_seq);                      // admitted: join at the reply
//! // The hooks reach the layer with its type (datapath.rs, tc.rs):
//! send::send_answer::<_, SipTcp>(ctx, &pkt) -> Option<Action>;
//! held::join_handed_over::<SipTcp>(&ctx, first_seq) -> Action;
//! handoff::handoff::<SipTcp>(&ctx) -> bool;
//! ```
//!
//! Two things stay to be decided when it comes: the reply program and the TC programs reach
//! one service's scratch today (TLS's), so a second would tell them which (its port's kind,
//! looked up again, or a word in the scratch); and its counters are its own to add.
// Map keys and values go by reference (by value, they were copied onto the 512-byte stack).
#![allow(clippy::needless_borrows_for_generic_args)]

pub mod cookie;
pub mod handoff;
pub mod held;
pub mod lookup;
pub mod send;

pub use lookup::{fill_tuple, flow_key};

use gateway_common::maps::FlowKey;

/// Bytes of a segment's payload a service looks at in one go (a longer one is copied window by
/// window): as far as packet bytes are read at all (`gateway_common::bytes::MAX_READ_OFFSET`).
/// The scratch's buffer is twice this, so that an index masked with `2 * PAYLOAD_LEN - 1`
/// never leaves it.
pub const PAYLOAD_LEN: usize = gateway_common::bytes::MAX_READ_OFFSET;

/// The TCP layer's part of a service's per-CPU scratch: the segment's payload, its
/// connection's key and socket tuple, copies of its headers and the SYN cookie's work. In map
/// memory rather than on the 512-byte stack.
#[repr(C, align(8))]
pub struct TcpScratch {
    /// Payload bytes, in the first half; the second half is slack (see [`PAYLOAD_LEN`]).
    pub buf: [u8; 2 * PAYLOAD_LEN],
    /// The segment's connection, client first ([`flow_key`]).
    pub key: FlowKey,
    /// The socket lookup's tuple (`bpf_sock_tuple`: IPv4 in its first 12 bytes, IPv6 in 36).
    pub tuple: [u8; 40],
    /// A copy of the segment's IP header, for the kernel's SYN-cookie check (IPv4 in its
    /// first 20 bytes).
    pub iph: [u8; 40],
    /// A copy of the segment's TCP header's first 20 bytes, likewise.
    pub th: [u8; 20],
    /// The NIC's SYN cookies' work ([`cookie`]), handed to their global functions.
    pub cookie: cookie::CookieScratch,
}

/// What the layer counts; each service counts them where its operators read them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TcpEvent {
    /// A SYN-ACK with a cookie sent from the NIC.
    CookieSent,
    /// A first segment held past its client address's budget.
    HoldOverBudget,
    /// A held first segment joined with the segment that admitted it, for the kernel.
    HeldJoined,
    /// A connection handed to its listener with a request socket.
    Handoff,
    /// A handoff the kernel refused (the segment went on, and is answered with a reset).
    HandoffFailed,
}

/// A TCP service, as the layer sees it.
pub trait TcpService {
    /// The service's per-CPU scratch, which holds a [`TcpScratch`].
    type Scratch;

    /// This CPU's scratch (per-CPU, used only by the program run that takes it).
    fn scratch() -> Option<*mut Self::Scratch>;

    /// The layer's part of `s`.
    fn tcp(s: &mut Self::Scratch) -> &mut TcpScratch;

    /// Counts `event` in the service's counters.
    fn count(event: TcpEvent);

    /// The held first segment of the connection in `s`'s key went to the kernel joined with
    /// the segment that admitted it: the connection is the kernel's now, its later segments
    /// (and copies of these) pass.
    fn joined(s: &mut Self::Scratch, v4: bool);
}
