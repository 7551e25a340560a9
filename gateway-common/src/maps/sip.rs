//! SIP at the NIC: transactions (`SIP_TXNS`) and dialogs (`SIP_DIALOGS`).

super::pinned_maps! {
    /// SIP transactions seen (transaction key to [`crate::maps::SipTxn`]).
    SIP_TXNS: u64 => SipTxn,
    /// SIP dialogs the server established (dialog key, see `SipInfo::dialog_key`, to
    /// [`crate::maps::SipDialog`]), learnt from its 2xx responses to INVITEs.
    SIP_DIALOGS: u64 => SipDialog,
}

/// Entries of the SIP transaction table (LRU).
pub const MAX_SIP_TXNS: u32 = 65536;

/// A SIP transaction whose original the datapath admitted, or an exempt request it saw (LRU: it
/// only tells retransmissions from originals; what the backlog holds is in `SIP_PENDING`, which
/// nothing evicts). A refused original makes no entry: a flood of them evicts no admitted
/// transaction's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SipTxn {
    /// When its entry was made (its original admitted), `CLOCK_MONOTONIC` ns.
    pub first_ns: u64,
    /// Requests of it seen (the original and its retransmissions).
    pub requests: u32,
    /// `TXN_*` bits.
    pub flags: u32,
}

/// [`SipTxn::flags`]: its original was admitted (the server took the work on). Only such an
/// INVITE transaction lets its ACK and CANCEL be exempt: one that was refused (or merely seen)
/// buys them nothing.
pub const TXN_ADMITTED: u32 = 1 << 0;

/// Entries of the SIP dialog table (LRU: losing a dialog only makes its requests originals).
pub const MAX_SIP_DIALOGS: u32 = 65536;

/// A dialog the server established: its requests (in-dialog, ACK, BYE) are exempt, up to
/// [`MAX_DIALOG_REQUESTS`] of them, until the server answers its BYE or it has been idle for
/// [`DIALOG_IDLE_NS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SipDialog {
    /// When the server's 2xx left, `CLOCK_MONOTONIC` ns.
    pub established_ns: u64,
    /// When it was last used (established, or an exempt request of it seen), `CLOCK_MONOTONIC`
    /// ns.
    pub last_ns: u64,
    /// Exempt requests of it seen so far (retransmissions included).
    pub requests: u32,
    /// Padding, zero.
    pub pad: u32,
}

/// Copies of one admitted request (retransmissions) the datapath passes, at most: RFC 3261's
/// client sends an INVITE 7 times within Timer B (32 s: T1 = 500 ms doubling) and a
/// non-INVITE request 11 times within Timer F (doubling to T2 = 4 s). Retransmissions of
/// admitted work are never refused while the server answers (the controller sets their
/// threshold so), so this is what bounds the copies one admitted request buys: a client that
/// sends more is no RFC 3261 client, and its extra copies are refused.
pub const MAX_TXN_COPIES: u32 = 10;

/// Exempt requests one dialog buys (its ACK, re-INVITEs, UPDATEs, INFOs, its BYE, and their
/// retransmissions): past this, its requests are judged as originals. A call makes a handful;
/// an IVR's DTMF by INFO some dozens.
pub const MAX_DIALOG_REQUESTS: u32 = 256;

/// A dialog none of whose requests was seen for this long is forgotten (its requests are then
/// judged as originals): one hour, longer than the session-refresh interval of RFC 4028's
/// timers (at most half of Session-Expires, whose default is 30 minutes).
pub const DIALOG_IDLE_NS: u64 = 3600 * 1_000_000_000;
