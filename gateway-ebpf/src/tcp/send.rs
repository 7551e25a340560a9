//! The reply program's part of the layer: the answer a classifier prepared for a segment
//! ([`super::cookie`]: a SYN-ACK with a cookie, the acknowledgement of a held segment) made and
//! sent back, or, for a held first segment whose hello was admitted, the segment joined with the
//! kernel inside the one that admitted it ([`super::held`]).

use gateway_common::packet::{Packet, TCP_SYN};

use super::{
    TcpEvent, TcpService,
    cookie::{HELD_ANSWER, SACK_ANSWER, gateway_held_answer, take_segment},
    held::join_or_hand_over,
};
use crate::{
    context::{Action, CopyOut, Rewrite},
    reply::answer_tcp,
};

/// Sends the answer the classifier of service `S` prepared for the segment `pkt`, if one is:
/// the frame rewritten into it and sent back ([`answer_tcp`]), or dropped when it could not be.
/// Counts a SYN-ACK sent. For a held hello admitted, the frame is rather made into one segment
/// with the held first one, for the listener ([`join_or_hand_over`]), where it can be.
#[inline(always)]
pub fn send_answer<R: Rewrite + CopyOut, S: TcpService>(ctx: &R, pkt: &Packet) -> Option<Action> {
    let full = S::scratch()?;
    // SAFETY: per-CPU slot, used only by this program run (the classifier that prepared the
    // answer ran on this CPU just before its tail call here).
    let full = unsafe { &mut *full };
    let pending = S::tcp(full).cookie.take_prepared();
    if pending == 0 {
        return None;
    }
    if pending == HELD_ANSWER || pending == SACK_ANSWER {
        let s = S::tcp(full);
        let first_seq = s.cookie.held_from();
        take_segment(ctx, pkt, &mut s.cookie);
        // The held first segment joined with this one, where it can be (an admitted hello's).
        if pending == HELD_ANSWER
            && let Some(joined) = join_or_hand_over::<R, S>(ctx, pkt, full, first_seq)
        {
            return Some(joined);
        }
        gateway_held_answer(S::tcp(full), u32::from(pkt.payload_len()), first_seq);
    }
    let (header, options, len) = S::tcp(full).cookie.made();
    let sent = answer_tcp(ctx, pkt, header, options, len);
    if sent.is_some() && header.2 & TCP_SYN != 0 {
        S::count(TcpEvent::CookieSent);
    }
    Some(sent.unwrap_or(Action::Drop))
}

/// Forgets an answer prepared by service `S`'s classifier that the reply program was not there
/// to send.
#[inline(always)]
pub fn forget_answer<S: TcpService>() {
    if let Some(s) = S::scratch() {
        // SAFETY: per-CPU slot, as above.
        S::tcp(unsafe { &mut *s }).cookie.take_prepared();
    }
}
