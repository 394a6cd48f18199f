//! The straight-line path must be invisible: for any frame, a worker with it and a worker
//! without it give the same verdict, leave the same bytes and count the same events. Client
//! segments and server replies of every kind (l2 and NAT, SYN-ACK, FIN, RST, no timestamp,
//! odd layouts, mutated bytes) go through both.

use std::cell::RefCell;

use cheetah_core::config::{Forwarding, Mode, VipConfig};
use cheetah_core::cookie::{tcp_ts, CookieLayout};
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::lb::{Bundle, Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::wire::tcp::flags::{ACK, FIN, PSH, RST, SYN};
use cheetah_core::wire::tcp_options::kind;
use cheetah_core::{Nanos, ServerId, Verdict};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const SECRET: Secret = Secret([9; 16]);
/// Servers 1..=4 active with M known, 5 draining with M unknown, 6 removed, 7 unknown.
const SERVERS: u16 = 6;
/// Besides VIP:VIP_PORT (every server), VIPs that some servers also serve, so that replies
/// come from servers with one VIP and with several, and from each VIP: (address, port,
/// servers). The ports differ, as NAT mode wants one VIP per backend address and port.
const OTHER_VIPS: [(u32, u16, &[u16]); 2] = [(VIP, 443, &[1, 2]), (VIP + 1, 8080, &[3])];

/// The M that server `id` starts with (ids 1..=4).
fn initial_msb(id: u16) -> u16 {
    0x0123 + id
}

fn worker(mode: Mode, forwarding: Forwarding, fast: bool) -> (ControlPlane, Worker) {
    let mut config = testkit::config(mode, forwarding, PolicyKind::RoundRobin, SERVERS);
    let template = config.vips[0].clone();
    for (address, port, servers) in OTHER_VIPS {
        config.vips.push(VipConfig {
            address: std::net::Ipv4Addr::from(address).into(),
            port,
            servers: servers.to_vec(),
            ..template.clone()
        });
    }
    let mut plane = ControlPlane::new(&config, &SECRET).unwrap();
    for id in 1..=4 {
        plane
            .shared()
            .msb
            .learn(ServerId(id), (initial_msb(id) as u32) << 16, 1);
    }
    plane.drain_server(5).unwrap();
    plane.remove_server(6, 1).unwrap();
    let mut worker = Worker::new(plane.shared().clone(), WorkerConfig::new(0, 1, &config));
    worker.set_fast_path(fast);
    (plane, worker)
}

/// A client segment echoing a cookie for `server` that displaced `echoed_msb` (or garbage
/// when `server` is 0x7fff).
fn frame(
    client: u32,
    port: u16,
    server: u16,
    echoed_msb: u16,
    flags: u8,
    sack: bool,
    payload: usize,
) -> Vec<u8> {
    let hash = FlowHasher::new(&SECRET).hash(&FlowKey::tcp(client, port, VIP, VIP_PORT));
    let tsecr = tcp_ts::insert(
        0x0000_4321,
        CookieLayout::DEFAULT.encode(ServerId(server), hash, echoed_msb),
    );
    let opts = if sack {
        options::nop_nop_ts_sack(77, tsecr)
    } else {
        options::nop_nop_ts(77, tsecr)
    };
    TcpFrame::from_client(client, port, flags, opts)
        .with_payload(&vec![0x61; payload])
        .build()
}

fn client_frames() -> impl Strategy<Value = Vec<u8>> {
    (
        0u32..50,
        1u16..=SERVERS + 1,
        any::<u16>(),
        prop_oneof![
            Just(ACK),
            Just(ACK | PSH),
            Just(ACK | FIN),
            Just(RST),
            Just(RST | ACK),
            // Without ACK: TSecr echoes nothing, routed like a segment without timestamps.
            Just(FIN),
            Just(PSH),
            Just(0),
            Just(SYN),
            Just(SYN | ACK)
        ],
        any::<bool>(),
        0usize..40,
    )
        .prop_map(|(c, s, v, f, sack, len)| {
            frame(
                testkit::client_ip(c),
                30_000 + c as u16,
                if s == SERVERS + 1 { 0x7fff } else { s },
                v,
                f,
                sack,
                len,
            )
        })
}

fn ts(tsval: u32) -> Vec<u8> {
    let mut o = vec![kind::TIMESTAMP, 10];
    o.extend_from_slice(&tsval.to_be_bytes());
    o.extend_from_slice(&0x0000_0777u32.to_be_bytes());
    o
}

const MSS: [u8; 4] = [kind::MSS, 4, 0x05, 0xb4];

/// The option layouts a server's reply may carry: Table 1's (non-SYN and SYN-ACK rows),
/// the slow-path rest, none, and malformed ones.
fn reply_options(layout: u8, tsval: u32) -> Vec<u8> {
    let nop = kind::NOP;
    let mut options = match layout {
        0 => options::nop_nop_ts(tsval, 0x777),
        1 => options::nop_nop_ts_sack(tsval, 0x777),
        2 => options::linux_syn(tsval, 0x777),
        3 => options::apple_syn(tsval, 0x777),
        4 => options::mss_nop_ws_sackok_ts(tsval, 0x777),
        // MSS NOP NOP TS SAckOK EOL (SYN-ACK row 3).
        5 => [
            &MSS[..],
            &[nop, nop],
            &ts(tsval),
            &[kind::SACK_PERMITTED, 2, 0, 0],
        ]
        .concat(),
        6 => options::windows_syn(),
        7 => options::ts_first(tsval, 0x777),
        8 => options::odd_offset_ts(tsval, 0x777),
        9 => Vec::new(),
        // The timestamp after a SACK block.
        10 => [
            &[nop, nop, kind::SACK, 10][..],
            &[0, 0, 0, 1, 0, 0, 0, 2],
            &[nop, nop],
            &ts(tsval),
        ]
        .concat(),
        // A timestamp option of the wrong length where NOP NOP TS would be.
        11 => vec![nop, nop, kind::TIMESTAMP, 8, 1, 2, 3, 4, 5, 6, 0, 0],
        // NOP NOP TS cut short: the header ends inside the option.
        12 => vec![nop, nop, kind::TIMESTAMP, 10, 1, 2, 3, 4],
        // Table 1's SYN-ACK pattern followed by a malformed option the wide compare skips.
        13 => [
            &MSS[..],
            &[kind::SACK_PERMITTED, 2],
            &ts(tsval),
            &[kind::WINDOW_SCALE, 0],
        ]
        .concat(),
        // NOP NOP TS with room to spare (a NOP-padded 40-byte header).
        _ => [&options::nop_nop_ts(tsval, 0x777)[..], &[nop; 8]].concat(),
    };
    while options.len() % 4 != 0 {
        options.push(kind::END);
    }
    options
}

/// A reply from server `server` (7: no such server) to client `c`, as an l2 or NAT server
/// sends it, with a TSval whose MSB is near the server's M (or anywhere), mostly from
/// VIP:VIP_PORT and sometimes from one of `OTHER_VIPS`, whether the server serves it or not.
fn reply_frames(forwarding: Forwarding) -> impl Strategy<Value = Vec<u8>> {
    (
        (
            0u32..50,
            1u16..=SERVERS + 1,
            // Mostly the common layouts, but every one often enough.
            prop_oneof![
                8 => Just(0u8),
                2 => Just(1u8),
                1 => Just(14u8),
                8 => 2u8..6,
                1 => Just(13u8),
                7 => 6u8..13,
            ],
        ),
        prop_oneof![
            4 => Just(ACK),
            2 => Just(ACK | PSH),
            2 => Just(SYN | ACK),
            1 => Just(ACK | FIN),
            1 => Just(ACK | FIN | PSH),
            1 => Just(RST),
            1 => Just(RST | ACK),
            1 => Just(SYN),
            1 => Just(SYN | FIN),
            1 => Just(0u8),
        ],
        (
            prop_oneof![0i32..4, Just(-1), Just(-3), Just(0x4000)],
            any::<u16>(),
        ),
        (
            0usize..40,
            0u8..8,
            prop_oneof![6 => Just(None), 1 => (0..OTHER_VIPS.len()).prop_map(Some)],
        ),
    )
        .prop_map(
            move |((c, server, layout), flags, (step, low), (payload, style, other_vip))| {
                let msb = (initial_msb(server) as i32 + step) as u16;
                let tsval = ((msb as u32) << 16) | low as u32;
                let client = testkit::client_ip(c);
                let port = 30_000 + c as u16;
                let opts = reply_options(layout, tsval);
                // Mostly the mode's own kind of reply, sometimes the other.
                let nat = (forwarding == Forwarding::Nat) != (style == 0);
                let mut reply = if nat {
                    TcpFrame::from_server_nat(server, client, port, flags, opts)
                } else {
                    TcpFrame::from_server_l2(server, client, port, flags, opts)
                };
                if let Some(other) = other_vip {
                    let (address, vip_port, _) = OTHER_VIPS[other];
                    reply.src_port = vip_port;
                    if !nat {
                        reply.src_ip = address;
                    }
                }
                reply.with_payload(&vec![0x62; payload]).build()
            },
        )
}

fn mutated(frames: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        frames,
        proptest::collection::vec((0usize..80, any::<u8>()), 0..3),
        0usize..100,
    )
        .prop_map(|(mut f, edits, cut)| {
            for (at, byte) in edits {
                if at < f.len() {
                    f[at] = byte;
                }
            }
            if cut < f.len() && cut % 3 == 0 {
                f.truncate(cut);
            }
            f
        })
}

/// The frame untagged, behind an 802.1Q tag, or behind 802.1ad and 802.1Q tags (a trunk
/// port's traffic): the straight line reads past the tags as the general pipeline does.
fn sometimes_tagged(frames: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (frames, 0u8..4).prop_map(|(frame, tags)| match tags {
        1 => testkit::vlan_tagged(&frame),
        2 => testkit::qinq_tagged(&frame),
        _ => frame,
    })
}

/// The frame without IP options, or with 4 to 40 bytes of them (Router Alert, then NOPs
/// and an EOL): the straight line skips them as the general pipeline does.
fn sometimes_optioned(frames: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (frames, 0usize..=10).prop_map(|(frame, words)| match words {
        0 => frame,
        _ => testkit::with_ip_options(&frame, &ip_options(words * 4)),
    })
}

fn ip_options(len: usize) -> Vec<u8> {
    let mut options = vec![0x94, 0x04, 0, 0];
    options.resize(len, 1);
    options[len - 1] = 0;
    options
}

const MODES: [(Mode, Forwarding); 6] = [
    (Mode::Cheetah, Forwarding::L2),
    (Mode::Cheetah, Forwarding::Nat),
    (Mode::Hash, Forwarding::L2),
    (Mode::Hash, Forwarding::Nat),
    (Mode::Maglev, Forwarding::L2),
    (Mode::Maglev, Forwarding::Nat),
];

/// One pair of workers per mode (building them is the slow part); both see the same
/// packets at the same times, so their state (M, loads, fallback table) stays identical.
#[test]
fn fast_path_gives_the_general_pipelines_verdict_and_bytes() {
    for (mode, forwarding) in MODES {
        let (_a, fast) = worker(mode, forwarding, true);
        let (_b, general) = worker(mode, forwarding, false);
        let pair = RefCell::new((fast, general, 0 as Nanos));
        let mut runner = TestRunner::new(Config {
            cases: 20_000,
            ..Config::default()
        });
        let packets = prop_oneof![
            mutated(sometimes_tagged(sometimes_optioned(client_frames()))),
            mutated(sometimes_tagged(sometimes_optioned(reply_frames(
                forwarding
            ))))
        ];
        runner
            .run(&packets, |packet| {
                let (fast, general, now) = &mut *pair.borrow_mut();
                // Time moves on by 0.7 ms a packet: load merges and the MSB clock checks
                // run as on a live worker.
                *now += 700_000;
                let (mut x, mut y) = (packet.clone(), packet);
                let (vx, vy) = (
                    fast.process(&mut x, *now, Ingress::ServerSide),
                    general.process(&mut y, *now, Ingress::ServerSide),
                );
                prop_assert_eq!(vx, vy);
                prop_assert_eq!(x, y);
                Ok(())
            })
            .unwrap();
        let (fast, general, _) = &*pair.borrow();
        let cheetah = mode == Mode::Cheetah;
        let (client, server) = if cheetah {
            (Bundle::ClientCookie, Bundle::ServerCookie)
        } else {
            (Bundle::ClientPick, Bundle::ServerPlain)
        };
        for bundle in [client, server] {
            let taken = fast.counters().bundle(bundle);
            assert!(
                taken > 500,
                "the straight-line path must actually be exercised ({mode:?} {forwarding:?} \
                 {bundle:?}): {taken}"
            );
        }
        assert!(
            general.counters().get(Counter::CookiesInserted) > 0 || !cheetah,
            "{forwarding:?}"
        );
        for bundle in Bundle::ALL {
            assert_eq!(general.counters().bundle(bundle), 0);
        }
        assert_eq!(general.counters().get(Counter::FastPath), 0);
        for c in Counter::ALL.iter().filter(|c| **c != Counter::FastPath) {
            assert_eq!(
                fast.counters().get(*c),
                general.counters().get(*c),
                "{mode:?} {forwarding:?} {}",
                c.name()
            );
        }
        for reason in cheetah_core::DropReason::ALL {
            assert_eq!(
                fast.counters().drops(*reason),
                general.counters().drops(*reason),
                "{mode:?} {forwarding:?} {}",
                reason.name()
            );
        }
    }
}

#[test]
fn the_fast_path_is_taken_for_the_common_case() {
    let (_plane, mut w) = worker(Mode::Cheetah, Forwarding::L2, true);
    let mut f = frame(testkit::client_ip(1), 40_000, 2, 0x0125, ACK, false, 10);
    assert_eq!(
        w.process(&mut f, 5, Ingress::ServerSide),
        Verdict::ToServer(ServerId(2))
    );
    assert_eq!(
        testkit::timestamps(&f).unwrap().1,
        0x0125_4321,
        "TSecr restored to server 2's MSB"
    );
    assert!(testkit::checksums_valid(&f));
    assert_eq!(w.counters().bundle(Bundle::ClientCookie), 1);
}

/// A trunk port's segment, behind one VLAN tag or two, takes the same straight line as an
/// untagged one and keeps its tags.
#[test]
fn tagged_segments_take_the_straight_line_with_their_tags() {
    let (_plane, mut w) = worker(Mode::Cheetah, Forwarding::L2, true);
    let untagged = frame(testkit::client_ip(1), 40_000, 2, 0x0125, ACK, false, 10);
    let mut expected = untagged.clone();
    assert_eq!(
        w.process(&mut expected, 5, Ingress::ServerSide),
        Verdict::ToServer(ServerId(2))
    );
    for (tags, mut f) in [
        (4, testkit::vlan_tagged(&untagged)),
        (8, testkit::qinq_tagged(&untagged)),
    ] {
        let before = w.counters().bundle(Bundle::ClientCookie);
        let tags_in = f[12..12 + tags].to_vec();
        assert_eq!(
            w.process(&mut f, 5, Ingress::ServerSide),
            Verdict::ToServer(ServerId(2))
        );
        assert_eq!(
            w.counters().bundle(Bundle::ClientCookie),
            before + 1,
            "{tags}-byte tags"
        );
        assert_eq!(f[12..12 + tags], tags_in[..], "tags kept");
        assert_eq!(f[..12], expected[..12]);
        assert_eq!(f[12 + tags..], expected[12..], "{tags}-byte tags");
    }
}

/// A segment with IP options takes the same straight line as one without, tagged or not,
/// and keeps its options; only the TCP header's bytes change (header checksum too in NAT).
#[test]
fn segments_with_ip_options_take_the_straight_line_and_keep_them() {
    for forwarding in [Forwarding::L2, Forwarding::Nat] {
        let (_plane, mut w) = worker(Mode::Cheetah, forwarding, true);
        let plain = frame(testkit::client_ip(1), 40_000, 2, 0x0125, ACK, false, 10);
        let mut expected = plain.clone();
        assert_eq!(
            w.process(&mut expected, 5, Ingress::ServerSide),
            Verdict::ToServer(ServerId(2))
        );
        for len in [4, 12, 40] {
            let options = ip_options(len);
            for (tags, optioned) in [
                (0, testkit::with_ip_options(&plain, &options)),
                (
                    8,
                    testkit::qinq_tagged(&testkit::with_ip_options(&plain, &options)),
                ),
            ] {
                let mut f = optioned.clone();
                let before = w.counters().bundle(Bundle::ClientCookie);
                assert_eq!(
                    w.process(&mut f, 5, Ingress::ServerSide),
                    Verdict::ToServer(ServerId(2)),
                    "{forwarding:?}, {len} bytes of options"
                );
                assert_eq!(w.counters().bundle(Bundle::ClientCookie), before + 1);
                let l3 = 14 + tags;
                assert_eq!(f[l3 + 20..l3 + 20 + len], options[..], "options kept");
                assert_eq!(
                    f[l3 + 20 + len..],
                    expected[34..],
                    "{forwarding:?}, {len} bytes: the same TCP segment out"
                );
                assert!(testkit::checksums_valid(&f), "{forwarding:?}, {len} bytes");
            }
        }
    }
}

/// Every Table 1 layout a server uses (NOP NOP TS on later segments, the four SYN-ACK rows)
/// takes the straight line and comes out with the cookie and valid checksums in both
/// forwarding modes. (A SYN-ACK answering a retried SYN takes the general path:
/// `tests/pipeline.rs` checks where its count goes.)
#[test]
fn common_replies_take_the_straight_line() {
    for forwarding in [Forwarding::L2, Forwarding::Nat] {
        let (_plane, mut w) = worker(Mode::Cheetah, forwarding, true);
        let hasher = FlowHasher::new(&SECRET);
        for (layout, flags) in [
            (0, ACK),
            (1, ACK),
            (14, ACK | FIN),
            (2, SYN | ACK),
            (3, SYN | ACK),
            (4, SYN | ACK),
            (5, SYN | ACK),
        ] {
            let before = w.counters().bundle(Bundle::ServerCookie);
            let (client, port, server) = (testkit::client_ip(3), 41_000, 3);
            let tsval = (initial_msb(server) as u32) << 16 | 0x5555;
            let opts = reply_options(layout, tsval);
            let reply = match forwarding {
                Forwarding::L2 => TcpFrame::from_server_l2(server, client, port, flags, opts),
                Forwarding::Nat => TcpFrame::from_server_nat(server, client, port, flags, opts),
            };
            let mut f = reply.with_payload(b"hello").build();
            assert_eq!(
                w.process(&mut f, 5, Ingress::ServerSide),
                Verdict::ToClient,
                "layout {layout}"
            );
            assert_eq!(
                w.counters().bundle(Bundle::ServerCookie),
                before + 1,
                "layout {layout} {forwarding:?}"
            );
            assert!(testkit::checksums_valid(&f), "layout {layout}");
            let (src, _, sport, _) = testkit::addresses(&f).unwrap();
            assert_eq!((src, sport), (VIP, VIP_PORT));
            let hash = hasher.hash(&FlowKey::tcp(client, port, VIP, VIP_PORT));
            let (out, _) = testkit::timestamps(&f).unwrap();
            assert_eq!(out & 0xffff, 0x5555);
            let decoded = CookieLayout::DEFAULT.decode(tcp_ts::extract(out), hash);
            assert_eq!(decoded.server, ServerId(server));
        }
    }
}

/// `process_batch` is `process` on each packet of the burst with the burst's `now`: same
/// verdicts, bytes and counters (every one, the straight-line bundles included).
#[test]
fn a_batch_is_its_packets_one_by_one() {
    let with_and_without_the_straight_line = MODES
        .iter()
        .map(|&(mode, forwarding)| (mode, forwarding, true))
        .chain([(Mode::Cheetah, Forwarding::L2, false)]);
    for (mode, forwarding, fast) in with_and_without_the_straight_line {
        let (_a, batched) = worker(mode, forwarding, fast);
        let (_b, single) = worker(mode, forwarding, fast);
        let pair = RefCell::new((batched, single, 0 as Nanos));
        let mut runner = TestRunner::new(Config {
            cases: 1_000,
            ..Config::default()
        });
        let bursts = proptest::collection::vec(
            prop_oneof![mutated(client_frames()), mutated(reply_frames(forwarding))],
            1..40,
        );
        runner
            .run(&bursts, |burst| {
                let (batched, single, now) = &mut *pair.borrow_mut();
                *now += 3_000_000;
                let (mut x, mut y) = (burst.clone(), burst);
                let mut vx = Vec::new();
                batched.process_batch(
                    x.iter_mut().map(|f| &mut f[..]),
                    *now,
                    Ingress::ServerSide,
                    |v| vx.push(v),
                );
                let vy: Vec<Verdict> = y
                    .iter_mut()
                    .map(|f| single.process(f, *now, Ingress::ServerSide))
                    .collect();
                prop_assert_eq!(vx, vy);
                prop_assert_eq!(x, y);
                Ok(())
            })
            .unwrap();
        let (batched, single, _) = &*pair.borrow();
        for c in Counter::ALL {
            assert_eq!(
                batched.counters().get(*c),
                single.counters().get(*c),
                "{mode:?} {forwarding:?} {}",
                c.name()
            );
        }
        for bundle in Bundle::ALL {
            assert_eq!(
                batched.counters().bundle(bundle),
                single.counters().bundle(bundle)
            );
        }
        for reason in cheetah_core::DropReason::ALL {
            assert_eq!(
                batched.counters().drops(*reason),
                single.counters().drops(*reason)
            );
        }
    }
}
