//! Traffic classes. The ids are stable: they index pinned maps and appear in dashboards.

/// Number of traffic classes; the size of every per-class map.
pub const NUM_CLASSES: usize = 7;

/// A traffic class (design brief §3). The discriminant is the class id.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Not a protected service: passed untouched, counted.
    Other = 0,
    /// A TLS ClientHello with no verified resumption offer.
    TlsNew = 1,
    /// A TLS ClientHello offering a session the server issued.
    TlsResumed = 2,
    /// Later packets of a TLS connection.
    TlsFlow = 3,
    /// A SIP request seen for the first time.
    SipOriginal = 4,
    /// A SIP request whose transaction was already seen.
    SipRetransmission = 5,
    /// SIP responses, and ACK, CANCEL, BYE and in-dialog requests of a dialog or transaction the
    /// server made: never dropped below their own ceiling.
    SipExempt = 6,
}

impl Class {
    /// Every class, in id order.
    pub const ALL: [Class; NUM_CLASSES] = [
        Class::Other,
        Class::TlsNew,
        Class::TlsResumed,
        Class::TlsFlow,
        Class::SipOriginal,
        Class::SipRetransmission,
        Class::SipExempt,
    ];

    /// The class id, the index into per-class maps.
    #[inline(always)]
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The class with this id.
    pub const fn from_id(id: u32) -> Option<Class> {
        if (id as usize) < NUM_CLASSES {
            Some(Self::ALL[id as usize])
        } else {
            None
        }
    }

    /// The class's stable name, as used by the CLI, the config file and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Class::Other => "other",
            Class::TlsNew => "tls-new",
            Class::TlsResumed => "tls-resumed",
            Class::TlsFlow => "tls-flow",
            Class::SipOriginal => "sip-original",
            Class::SipRetransmission => "sip-retransmission",
            Class::SipExempt => "sip-exempt",
        }
    }

    /// Looks a class up by its name.
    pub fn from_name(name: &str) -> Option<Class> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether admission limits may be set on this class. `other` is not a protected service, so
    /// it is never limited. (`sip-exempt` finishes work the server took on, but it has a ceiling
    /// of its own: a flood of real ACKs and BYEs is still a flood.)
    pub const fn is_limitable(self) -> bool {
        !matches!(self, Class::Other)
    }

    /// The class whose limits this one's follow from: sip-retransmission's are set by
    /// sip-original's law (half its backlog, or none while the server answers), so whoever
    /// owns sip-original's limits owns these too. `None` for a class whose limits are its own.
    /// The one place this pairing is written.
    pub const fn led_by(self) -> Option<Class> {
        match self {
            Class::SipRetransmission => Some(Class::SipOriginal),
            _ => None,
        }
    }

    /// The classes whose limits follow from this one's ([`Class::led_by`] the other way).
    pub fn leads(self) -> impl Iterator<Item = Class> {
        Self::ALL
            .into_iter()
            .filter(move |c| c.led_by() == Some(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_round_trip() {
        for (i, c) in Class::ALL.iter().enumerate() {
            assert_eq!(c.id() as usize, i);
            assert_eq!(Class::from_id(i as u32), Some(*c));
            assert_eq!(Class::from_name(c.name()), Some(*c));
        }
        assert_eq!(Class::from_id(NUM_CLASSES as u32), None);
        assert_eq!(Class::from_name("tls"), None);
        assert_eq!(Class::SipExempt.id(), 6);
    }

    #[test]
    fn only_sip_retransmission_follows_another_class_and_it_follows_sip_original() {
        for c in Class::ALL {
            let led: alloc::vec::Vec<Class> = c.leads().collect();
            match c {
                Class::SipOriginal => assert_eq!(led, [Class::SipRetransmission]),
                _ => assert!(led.is_empty(), "{c:?}"),
            }
            if let Some(l) = c.led_by() {
                assert!(l.leads().any(|f| f == c));
                assert_eq!(l.led_by(), None, "a leader leads itself");
            }
        }
    }
}
