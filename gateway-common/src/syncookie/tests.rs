use super::*;

const KEY: CookieKey = CookieKey {
    k0: 0x0706_0504_0302_0100,
    k1: 0x0f0e_0d0c_0b0a_0908,
};

fn flow(last: u8, sport: u16) -> FlowKey {
    let mut k = FlowKey::default();
    k.saddr[10] = 0xff;
    k.saddr[11] = 0xff;
    k.saddr[12..].copy_from_slice(&[10, 0, 0, last]);
    k.daddr[10] = 0xff;
    k.daddr[11] = 0xff;
    k.daddr[12..].copy_from_slice(&[10, 0, 0, 1]);
    k.sport = sport;
    k.dport = 443;
    k
}

#[test]
fn a_cookie_checks_with_its_own_segment_and_keeps_the_options() {
    let o = TcpOptions {
        mss: 1460,
        wscale: 7,
        sack: true,
        ts: true,
        tsval: 1,
        tsecr: 0,
    };
    let f = flow(2, 40000);
    let now = 1_000 * COOKIE_PERIOD_NS + 5;
    let period = period_of(now);
    let (byte, mss) = options_byte(&o, true, period);
    assert_eq!(mss, 1460);
    let isn = 0xffff_fff0;
    let cookie = make_cookie(&KEY, &f, isn, period, byte);
    let seq = isn.wrapping_add(1);
    let ack = cookie.wrapping_add(1);
    let kept = CookieOptions {
        mss: 1460,
        wscale: 7,
        sack: true,
    };
    assert_eq!(check_cookie(&KEY, &f, seq, ack, now, true), Some(kept));
    // Good in the next period, not the one after.
    assert_eq!(
        check_cookie(&KEY, &f, seq, ack, now + COOKIE_PERIOD_NS, true),
        Some(kept)
    );
    assert_eq!(
        check_cookie(&KEY, &f, seq, ack, now + 2 * COOKIE_PERIOD_NS, true),
        None
    );
    // Not before it was made either (the parity says the last period).
    assert_eq!(
        check_cookie(&KEY, &f, seq, ack, now - COOKIE_PERIOD_NS, true),
        None
    );
}

#[test]
fn a_cookie_fails_for_any_other_connection_sequence_key_or_options() {
    let o = TcpOptions {
        mss: 1400,
        wscale: WSCALE_NONE,
        ..TcpOptions::default()
    };
    let f = flow(2, 40000);
    let now = 77 * COOKIE_PERIOD_NS;
    let (byte, mss) = options_byte(&o, true, period_of(now));
    assert_eq!(mss, 1300);
    let cookie = make_cookie(&KEY, &f, 1000, period_of(now), byte);
    let ok = |k: &CookieKey, f: &FlowKey, seq: u32, ack: u32| {
        check_cookie(k, f, seq, ack, now, true).is_some()
    };
    assert!(ok(&KEY, &f, 1001, cookie + 1));
    assert!(!ok(&KEY, &flow(3, 40000), 1001, cookie + 1));
    assert!(!ok(&KEY, &flow(2, 40001), 1001, cookie + 1));
    assert!(!ok(&KEY, &f, 1002, cookie + 1));
    // A later segment (its sequence past the hello) is not a first segment.
    assert!(!ok(&KEY, &f, 1001 + 100, cookie + 1));
    let other = CookieKey { k0: 1, k1: 2 };
    assert!(!ok(&other, &f, 1001, cookie + 1));
    // The options byte is under the hash: another MSS, scale or SACK bit does not check.
    for bit in 0..8 {
        assert!(!ok(&KEY, &f, 1001, (cookie ^ (1 << bit)) + 1), "bit {bit}");
    }
    // An unset key checks nothing, even a cookie made with it.
    let unset = CookieKey::default();
    let c = make_cookie(&unset, &f, 1000, period_of(now), byte);
    assert!(!ok(&unset, &f, 1001, c + 1));
}

#[test]
fn options_of_a_linux_syn_are_read_and_malformed_ones_end_the_walk() {
    let mut opts = [0u8; 64];
    // MSS 1460, SACK permitted, timestamps, NOP, window scale 7: what Linux sends.
    let linux = [
        2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 9, 0, 0, 0, 0, 1, 3, 3, 7,
    ];
    opts[..20].copy_from_slice(&linux);
    let o = parse_options(&opts, 20);
    assert_eq!(
        o,
        TcpOptions {
            mss: 1460,
            wscale: 7,
            sack: true,
            ts: true,
            tsval: 9,
            tsecr: 0
        }
    );
    // Cut short: the window scale's three bytes are not all there.
    let o = parse_options(&opts, 18);
    assert_eq!(o.wscale, WSCALE_NONE);
    assert!(o.ts);
    // A length below two ends the walk.
    let mut bad = [0u8; 64];
    bad[..8].copy_from_slice(&[2, 1, 0, 0, 4, 2, 0, 0]);
    assert_eq!(parse_options(&bad, 8), parse_options(&[0u8; 64], 0));
    // A scale above 14 is taken as 14 (RFC 7323).
    let mut big = [0u8; 64];
    big[..4].copy_from_slice(&[1, 3, 3, 15]);
    assert_eq!(parse_options(&big, 4).wscale, 14);
    // A length past 40 is read as 40.
    let mut long = [1u8; 64];
    long[40..44].copy_from_slice(&[2, 4, 1, 0]);
    assert_eq!(parse_options(&long, 60).mss, 0);
}

#[test]
fn the_synack_options_echo_what_the_client_sent_and_fit_its_syn() {
    let all = TcpOptions {
        mss: 1460,
        wscale: 7,
        sack: true,
        ts: true,
        tsval: 0x0102_0304,
        tsecr: 0,
    };
    let (b, n) = synack_options(&all, 1460, 0xa0b0_c0d0);
    assert_eq!(n, 20);
    assert_eq!(
        b,
        [
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0xa0, 0xb0, 0xc0, 0xd0, 1, 2, 3, 4, 1, 3, 3, OUR_WSCALE
        ]
    );
    let parsed = {
        let mut o = [0u8; 64];
        o[..20].copy_from_slice(&b);
        parse_options(&o, n)
    };
    assert_eq!(parsed.mss, 1460);
    assert_eq!(parsed.wscale, OUR_WSCALE);
    assert!(parsed.sack && parsed.ts);
    assert_eq!((parsed.tsval, parsed.tsecr), (0xa0b0_c0d0, 0x0102_0304));
    let none = TcpOptions {
        wscale: WSCALE_NONE,
        ..TcpOptions::default()
    };
    assert_eq!(synack_options(&none, 536, 0).1, 4);
    let sack_only = TcpOptions { sack: true, ..none };
    let (b, n) = synack_options(&sack_only, 536, 0);
    assert_eq!((n, &b[4..8]), (8, &[1u8, 1, 4, 2][..]));
    for ts in [false, true] {
        for sack in [false, true] {
            for wscale in [WSCALE_NONE, 0, 14] {
                let o = TcpOptions {
                    ts,
                    sack,
                    wscale,
                    ..TcpOptions::default()
                };
                let (_, n) = synack_options(&o, 536, 0);
                assert_eq!(n % 4, 0);
                assert!(n <= 20);
            }
        }
    }
}

#[test]
fn the_mss_announced_is_the_largest_of_the_table_not_above_the_clients() {
    assert_eq!(mss_index(&MSS_V4, 0), 0);
    assert_eq!(mss_index(&MSS_V4, 1299), 0);
    assert_eq!(mss_index(&MSS_V4, 1300), 1);
    assert_eq!(mss_index(&MSS_V4, 1460), 3);
    assert_eq!(mss_index(&MSS_V4, 65495), 3);
    assert_eq!(mss_index(&MSS_V6, 1440), 3);
    assert_eq!(mss_index(&MSS_V6, 1419), 1);
    for v4 in [true, false] {
        for idx in 0..4u8 {
            for period in [0u64, 1] {
                let table = if v4 { MSS_V4 } else { MSS_V6 };
                let o = TcpOptions {
                    mss: table[idx as usize],
                    wscale: 3,
                    sack: idx % 2 == 0,
                    ..TcpOptions::default()
                };
                let (byte, mss) = options_byte(&o, v4, period);
                let d = decode_options(byte, v4);
                assert_eq!((d.mss, d.wscale, d.sack), (mss, 3, idx % 2 == 0));
                assert_eq!(u64::from(byte >> 7), period);
            }
        }
    }
}

#[test]
fn a_held_hellos_acknowledgement_carries_the_timestamps_and_a_sack_of_the_segment() {
    let o = TcpOptions {
        ts: true,
        tsval: 0x0102_0304,
        ..TcpOptions::default()
    };
    let (b, n) = held_ack_options(&o, true, 0xffff_fff0, 0x20, 9);
    assert_eq!(n, 24);
    assert_eq!(&b[..12], &[1, 1, 8, 10, 0, 0, 0, 9, 1, 2, 3, 4]);
    // The block wraps around the sequence space like the segment does.
    assert_eq!(
        &b[12..],
        &[1, 1, 5, 10, 0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 0x10]
    );
    let mut opts = [0u8; 64];
    opts[..24].copy_from_slice(&b);
    let parsed = parse_options(&opts, n);
    assert!(parsed.ts);
    assert_eq!((parsed.tsval, parsed.tsecr), (9, 0x0102_0304));
    let none = TcpOptions::default();
    assert_eq!(held_ack_options(&none, false, 1, 1, 1).1, 0);
    let (b, n) = held_ack_options(&none, true, 1, 1, 1);
    assert_eq!((n, &b[..4]), (12, &[1u8, 1, 5, 10][..]));
}
