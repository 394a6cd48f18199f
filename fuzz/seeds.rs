//! Seed inputs for the `pipeline` fuzz target, built from real packets (`testkit`).
//!
//! Random bytes almost never make a TCP segment whose checksum and cookie line up, so the
//! fuzzer starts from whole conversations: every SYN option layout, server replies that
//! teach M and insert cookies, client packets echoing a correct cookie, ICMP errors quoting
//! a cookie, VLAN tags, IPv6, fragments, and truncated variants. Written by the ignored
//! test `write_fuzz_seeds` in `crates/core/tests/fuzz_corpus.rs` (see docs/fuzzing.md).

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::cookie::{tcp_ts, CookieLayout};
use cheetah_core::hash::{FlowHasher, FlowKey};
use cheetah_core::lb::Ingress;
use cheetah_core::policy::PolicyKind;
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::types::ServerId;
use cheetah_core::wire::ip_proto;
use cheetah_core::wire::tcp::flags;

use super::harness::input::{Action, InputBuilder, Setup, IPV6_VIP};

const CLIENT_PORT: u16 = 40_000;
/// The servers' clocks in the seeds (TSval high half = M).
const SERVER_TS: u32 = 0x1234_5678;
const CLIENT_TS: u32 = 0x0badc0de;

fn client() -> u32 {
    testkit::client_ip(7)
}

/// The TSecr a client echoes for a server's TSval under the harness secret.
fn echoed_cookie(server: u16, tsval: u32, vip_port: u16) -> u32 {
    let hash = FlowHasher::new(&super::harness::SECRET).hash(&FlowKey {
        client_ip: client(),
        vip_ip: testkit::VIP,
        client_port: CLIENT_PORT,
        vip_port,
        protocol: ip_proto::TCP,
    });
    tcp_ts::insert(
        tsval,
        CookieLayout::DEFAULT.encode(ServerId(server), hash, tcp_ts::extract(tsval)),
    )
}

fn from_server(forwarding: Forwarding, server: u16, flags: u8, options: Vec<u8>) -> TcpFrame {
    match forwarding {
        Forwarding::L2 => TcpFrame::from_server_l2(server, client(), CLIENT_PORT, flags, options),
        Forwarding::Nat => TcpFrame::from_server_nat(server, client(), CLIENT_PORT, flags, options),
    }
}

/// A client -> VIP UDP datagram.
pub fn udp_to_vip() -> Vec<u8> {
    let mut frame = TcpFrame::from_client(client(), CLIENT_PORT, flags::SYN, Vec::new()).build();
    frame[23] = ip_proto::UDP;
    testkit::refill_ipv4_checksum(&mut frame, 14);
    frame
}

/// A client SYN to the VIP marked as a first fragment (more-fragments set).
pub fn fragment_to_vip() -> Vec<u8> {
    let mut frame = syn(options::linux_syn(CLIENT_TS, 0));
    frame[20] |= 0x20;
    testkit::refill_ipv4_checksum(&mut frame, 14);
    frame
}

fn syn(options: Vec<u8>) -> Vec<u8> {
    TcpFrame::from_client(client(), CLIENT_PORT, flags::SYN, options).build()
}

fn client_ack(tsecr: u32) -> Vec<u8> {
    TcpFrame::from_client(
        client(),
        CLIENT_PORT,
        flags::ACK,
        options::nop_nop_ts(CLIENT_TS + 1, tsecr),
    )
    .with_payload(b"GET / HTTP/1.1\r\n\r\n")
    .build()
}

/// One conversation: SYN, the server's SYN-ACK and data, the client's echo, an ICMP error
/// about the server's packet, FIN and RST, with M known and then imported.
fn conversation(setup: Setup, syn_options: Vec<u8>, server: u16) -> Vec<u8> {
    let fwd = setup.forwarding;
    let synack = from_server(
        fwd,
        server,
        flags::SYN | flags::ACK,
        options::linux_syn(SERVER_TS, CLIENT_TS),
    )
    .build();
    let data = from_server(
        fwd,
        server,
        flags::ACK | flags::PSH,
        options::nop_nop_ts(SERVER_TS + 5, CLIENT_TS + 1),
    )
    .with_payload(b"HTTP/1.1 200 OK\r\n\r\n")
    .build();
    let cookie = echoed_cookie(server, SERVER_TS + 5, testkit::VIP_PORT);
    // The ICMP error quotes what the client saw: the VIP as source, the cookie in TSval.
    let mut quoted = TcpFrame::from_server_l2(
        server,
        client(),
        CLIENT_PORT,
        flags::ACK,
        options::nop_nop_ts(cookie, CLIENT_TS + 1),
    )
    .with_payload(&[0x55; 64])
    .build();
    quoted.truncate(quoted.len());
    let icmp_full = testkit::icmp_frag_needed(0x0a09_0001, &quoted, 20 + 32 + 16);
    let icmp_short = testkit::icmp_frag_needed(0x0a09_0001, &quoted, 28);
    let fin = TcpFrame::from_client(
        client(),
        CLIENT_PORT,
        flags::FIN | flags::ACK,
        options::nop_nop_ts(CLIENT_TS + 9, cookie),
    )
    .build();
    let rst = from_server(fwd, server, flags::RST, Vec::new()).build();
    InputBuilder::new(setup)
        .packet(0, 1, &syn(syn_options))
        .packet(0, 1, &synack)
        .packet(1, 2, &data)
        .packet(0, 1, &client_ack(cookie))
        .packet(0, 3, &icmp_full)
        .packet(1, 3, &icmp_short)
        .msb(server, 0x1233)
        .packet(0, 1, &client_ack(cookie ^ 0x8000_0000))
        .packet(0, 4, &fin)
        .packet(1, 4, &rst)
        .build()
}

/// A connection that idles `periods` MSB periods (66 s steps, carried by dropped UDP
/// datagrams, since only packets move time) and then echoes the cookie of the server's
/// last segment, as a client whose TS.Recent no server keepalive refreshed does: restored
/// exactly up to 2^k - 2 periods back, and counted when past 2^(k-1).
fn idle_echo(setup: Setup, server: u16, periods: u8) -> Vec<u8> {
    let synack = from_server(
        setup.forwarding,
        server,
        flags::SYN | flags::ACK,
        options::linux_syn(SERVER_TS, CLIENT_TS),
    )
    .build();
    let mut input = InputBuilder::new(setup)
        .packet(0, 1, &syn(options::linux_syn(CLIENT_TS, 0)))
        .packet(0, 1, &synack);
    for _ in 0..periods {
        input = input.packet(0, 5, &udp_to_vip());
    }
    input
        .packet(
            0,
            1,
            &client_ack(echoed_cookie(server, SERVER_TS, testkit::VIP_PORT)),
        )
        .build()
}

/// Packets that claim to be a server's reply and must teach nothing: one from the clients'
/// side, one addressed to the VIP on another port (the spoof issue #21 names for nat), and
/// one whose TSval is far ahead of real time; then the client echoes the real reply's
/// cookie, which must still be restored exactly.
fn forged_replies(setup: Setup, server: u16) -> Vec<u8> {
    let fwd = setup.forwarding;
    let reply = |tsval: u32| {
        from_server(
            fwd,
            server,
            flags::ACK,
            options::nop_nop_ts(tsval, CLIENT_TS),
        )
        .build()
    };
    let synack = from_server(
        fwd,
        server,
        flags::SYN | flags::ACK,
        options::linux_syn(SERVER_TS, CLIENT_TS),
    )
    .build();
    let far = SERVER_TS.wrapping_add(0x4000_0000);
    let mut to_vip = from_server(fwd, server, flags::ACK, options::nop_nop_ts(far, CLIENT_TS));
    to_vip.dst_ip = testkit::VIP;
    to_vip.dst_port = 9;
    InputBuilder::new(setup)
        .packet(0, 1, &syn(options::linux_syn(CLIENT_TS, 0)))
        .packet(0, 1, &synack)
        .packet_from(Ingress::ClientSide, 0, 3, &reply(far))
        .packet(0, 3, &to_vip.build())
        .packet(1, 3, &reply(far))
        .packet_from(
            Ingress::ClientSide,
            0,
            1,
            &client_ack(echoed_cookie(server, SERVER_TS, testkit::VIP_PORT)),
        )
        .build()
}

/// A client without timestamps: the fallback table routes it, across control changes.
fn no_timestamps(setup: Setup, action: Action, server: u16) -> Vec<u8> {
    let ack = TcpFrame::from_client(client(), CLIENT_PORT, flags::ACK, Vec::new()).build();
    let synack = from_server(
        setup.forwarding,
        server,
        flags::SYN | flags::ACK,
        options::windows_syn(),
    )
    .build();
    let quoted =
        TcpFrame::from_server_l2(server, client(), CLIENT_PORT, flags::ACK, Vec::new()).build();
    InputBuilder::new(setup)
        .packet(0, 1, &syn(options::windows_syn()))
        .packet(0, 1, &synack)
        .packet(0, 1, &ack)
        .action(action, server)
        .packet(0, 2, &ack)
        .packet(0, 2, &testkit::icmp_frag_needed(0x0a09_0001, &quoted, 48))
        .build()
}

/// New connections spread by a load-aware policy after load reports, across merges.
fn loads(setup: Setup) -> Vec<u8> {
    let mut builder = InputBuilder::new(setup)
        .load(1, 1, 9_000)
        .load(2, 2, 40)
        .load(3, 3, 150);
    for port in 0..8u16 {
        let syn = TcpFrame::from_client(
            client(),
            CLIENT_PORT + port,
            flags::SYN,
            options::linux_syn(CLIENT_TS, 0),
        )
        .build();
        builder = builder.packet((port % 2) as u8, 2, &syn);
    }
    builder.build()
}

/// Malformed and unbalanced traffic, each in its own record.
fn odd_packets(setup: Setup) -> Vec<u8> {
    let good = syn(options::linux_syn(CLIENT_TS, 0));
    let mut bad_ihl = good.clone();
    bad_ihl[14] = 0x44;
    let mut bad_total = good.clone();
    bad_total[16..18].copy_from_slice(&2000u16.to_be_bytes());
    let mut bad_offset = good.clone();
    bad_offset[46] = 0xf0;
    let mut bad_option = good.clone();
    bad_option[55] = 1;
    let mut bad_ts_len = good.clone();
    bad_ts_len[61] = 8;
    let mut other_port = good.clone();
    other_port[36..38].copy_from_slice(&8080u16.to_be_bytes());
    let mut builder = InputBuilder::new(setup);
    for packet in [
        good[..10].to_vec(),
        good[..30].to_vec(),
        good[..50].to_vec(),
        bad_ihl,
        bad_total,
        bad_offset,
        bad_option,
        bad_ts_len,
        other_port,
        udp_to_vip(),
        fragment_to_vip(),
        testkit::arp_request(client()),
        testkit::ipv6_syn(CLIENT_PORT, IPV6_VIP),
        testkit::vlan_tagged(&good),
        from_server(setup.forwarding, 9, flags::ACK, options::nop_nop_ts(1, 2)).build(),
    ] {
        builder = builder.packet(0, 0, &packet);
    }
    builder.build()
}

/// Every seed, named.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let layouts: [(&str, Vec<u8>); 6] = [
        ("linux", options::linux_syn(CLIENT_TS, 0)),
        ("apple", options::apple_syn(CLIENT_TS, 0)),
        (
            "mss-nop-ws-sackok-ts",
            options::mss_nop_ws_sackok_ts(CLIENT_TS, 0),
        ),
        ("ts-first", options::ts_first(CLIENT_TS, 0)),
        ("odd-offset", options::odd_offset_ts(CLIENT_TS, 0)),
        ("windows", options::windows_syn()),
    ];
    for (mode, forwarding) in [
        (Mode::Cheetah, Forwarding::L2),
        (Mode::Cheetah, Forwarding::Nat),
        (Mode::Hash, Forwarding::L2),
        (Mode::Maglev, Forwarding::Nat),
    ] {
        let setup = Setup::new(mode, forwarding);
        let tag = format!("{}-{}", mode.name(), forwarding.name());
        for (name, layout) in &layouts {
            seeds.push((
                format!("{tag}-conversation-{name}"),
                conversation(setup, layout.clone(), 2),
            ));
        }
        let extra = Setup {
            extra_vips: true,
            two_workers: true,
            drain_two: true,
            policy: PolicyKind::LeastLoaded,
            ..setup
        };
        seeds.push((
            format!("{tag}-conversation-extra-vips"),
            conversation(extra, options::apple_syn(CLIENT_TS, 0), 2),
        ));
        seeds.push((format!("{tag}-odd-packets"), odd_packets(setup)));
        for policy in [
            PolicyKind::AutoWeightedRoundRobin,
            PolicyKind::LeastLoaded,
            PolicyKind::PowerOfTwo,
        ] {
            let loaded = Setup {
                policy,
                two_workers: true,
                ..setup
            };
            seeds.push((format!("{tag}-loads-{}", policy.name()), loads(loaded)));
        }
        seeds.push((format!("{tag}-odd-packets-extra-vips"), odd_packets(extra)));
        if mode == Mode::Cheetah {
            seeds.push((format!("{tag}-forged-replies"), forged_replies(setup, 1)));
            for periods in [5, 8, 9, 15] {
                seeds.push((
                    format!("{tag}-idle-echo-{periods}-periods"),
                    idle_echo(setup, 1, periods),
                ));
            }
        }
        for (action, name) in [
            (Action::Drain, "drain"),
            (Action::Remove, "remove"),
            (Action::LeavePool, "leave"),
        ] {
            seeds.push((
                format!("{tag}-no-timestamps-{name}"),
                no_timestamps(setup, action, 1),
            ));
        }
    }
    seeds
}
