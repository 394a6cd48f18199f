//! The daemon's side of the in-kernel path, against the real program (loaded, not
//! attached; needs root): the control plane's clock table lives in the program's mmapped
//! arrays, and what the publisher (`dataplane/xdp_tables.rs`) writes is enough for the
//! kernel to forward an established client segment and a NAT backend's reply as the core
//! would; with `datapath = "afxdp"` it forwards nothing.

use cheetah_core::config::Forwarding;
use cheetah_core::config::Mode;
use cheetah_core::cookie::msb::KNOWN;
use cheetah_core::hash::{FlowKey, Secret};
use cheetah_core::lb::Ingress;
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::types::{ServerId, NANOS_PER_SEC};
use cheetah_core::wire::tcp::flags::ACK;
use cheetah_daemon::dataplane::vip_slots;
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::xdp_layout::{
    Encode, NextHop, NextHopKey, VipSlot, NEXT_HOP_KNOWN, STAT_FAST_CLIENT_COOKIE,
    STAT_FAST_SERVER_COOKIE, STAT_REPLY_BY_STEERING, STAT_UP_COOKIE, STAT_UP_OTHER,
};
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};
use libbpf_rs::{MapCore, MapFlags};

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/on_loopback.rs"]
mod on_loopback;
use on_loopback::{lo, stat, LOOPBACK, ROUTES_VIA_LO, XDP_TX};

const XDP_PASS: u32 = 2;

fn publish(
    program: &SteeringProgram,
    plane: &ControlPlane,
    publisher: &mut Publisher,
    fast_path: bool,
) {
    let lo = lo();
    let snapshot = plane.shared().snapshot.load();
    let publication = Publication {
        snapshot: &snapshot,
        layout: plane.layout(),
        interfaces: &[lo],
        sides: &[Ingress::ServerSide],
        fast_path,
        fallback_sets: plane.shared().fallback.sets(),
    };
    publisher
        .write(program, wanted(&publication, ROUTES_VIA_LO, ""))
        .unwrap();
}

#[test]
fn the_kernel_forwards_by_the_published_tables_and_the_shared_clock() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
    let program = SteeringProgram::load(config.fallback_table_capacity).unwrap();
    let words = program.kernel_words().unwrap();
    let plane =
        ControlPlane::new_with_tables(&config, &Secret([7; 16]), &|layout, _| words.tables(layout))
            .unwrap();
    let shared = plane.shared();
    let server = ServerId(2);
    let msb = 0x1234u16;

    // The client's echo of server 2's cookie, before the LB knows the server's clock.
    let (client, client_port) = (testkit::client_ip(9), 40_000);
    let hash = shared
        .hasher
        .hash(&FlowKey::tcp(client, client_port, VIP, VIP_PORT));
    let cookie = plane.layout().encode(server, hash, msb);
    let tsecr = (cookie as u32) << 16 | 0x5678;
    let frame =
        TcpFrame::from_client(client, client_port, ACK, options::nop_nop_ts(99, tsecr)).build();

    let mut publisher = Publisher::new();
    publish(&program, &plane, &mut publisher, true);
    let unknown = stat(&program, STAT_UP_COOKIE);
    let (_, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_eq!(bytes, frame, "an unknown clock: handed up unchanged");
    assert_eq!(stat(&program, STAT_UP_COOKIE), unknown + 1);

    // A reply teaches the core's table; the kernel reads the same words.
    shared
        .msb
        .learn(server, (msb as u32) << 16 | 7, NANOS_PER_SEC);
    let seen = program
        .try_map("msb_seen")
        .unwrap()
        .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
        .unwrap()
        .unwrap();
    let at = 4 * server.index();
    assert_eq!(seen[at..at + 4], (KNOWN | msb as u32).to_ne_bytes());

    let routed = stat(&program, STAT_FAST_CLIENT_COOKIE);
    let (verdict, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_eq!(
        verdict, XDP_TX,
        "the server's egress is lo, where it came in"
    );
    assert_eq!(stat(&program, STAT_FAST_CLIENT_COOKIE), routed + 1);
    assert_eq!(
        testkit::timestamps(&bytes),
        Some((99, (msb as u32) << 16 | 0x5678)),
        "TSecr restored from the shared clock table"
    );
    assert_eq!(bytes[0..6], testkit::server_mac(server.0));
    assert_eq!(bytes[6..12], [0; 6], "the egress interface's MAC");
    assert!(testkit::checksums_valid(&bytes));

    // datapath = "afxdp": the same tables, the fast path flag off.
    publish(&program, &plane, &mut publisher, false);
    let (verdict, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_ne!(verdict, XDP_TX);
    assert_eq!(bytes, frame);
    assert_eq!(stat(&program, STAT_FAST_CLIENT_COOKIE), routed + 1);
}

/// A NAT backend's reply is found in `reply_senders`, as published, without steering's
/// lookups; addressed to one of the host's own addresses it is the answer to the host's
/// health probe, and goes to the host kernel unchanged as steering always sent it, not on
/// as a reply.
#[test]
fn a_nat_backends_reply_is_known_unless_it_answers_the_host() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let config = testkit::config(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 3);
    let program = SteeringProgram::load(config.fallback_table_capacity).unwrap();
    let words = program.kernel_words().unwrap();
    let plane =
        ControlPlane::new_with_tables(&config, &Secret([7; 16]), &|layout, _| words.tables(layout))
            .unwrap();
    let server = ServerId(2);
    let msb = 0x1234u16;
    plane
        .shared()
        .msb
        .learn(server, (msb as u32) << 16 | 7, NANOS_PER_SEC);
    publish(&program, &plane, &mut Publisher::new(), true);
    // Every client behind lo (the next hop from the map, not the host's FIB).
    let everywhere = NextHopKey {
        prefixlen: 0,
        addr: [0; 4],
    };
    let via_lo = NextHop {
        kind: NEXT_HOP_KNOWN,
        ifindex: LOOPBACK,
        mtu: 1500,
        dmac: [2, 0, 0, 0, 0xc1, 1],
        smac: [0; 6],
    };
    program
        .try_map("next_hops")
        .unwrap()
        .update(&everywhere.to_bytes(), &via_lo.to_bytes(), MapFlags::ANY)
        .unwrap();

    let (client, client_port) = (testkit::client_ip(9), 40_000);
    let reply = TcpFrame::from_server_nat(
        server.0,
        client,
        client_port,
        ACK,
        options::nop_nop_ts((msb as u32) << 16 | 0x42, 77),
    )
    .build();
    let written = stat(&program, STAT_FAST_SERVER_COOKIE);
    let by_steering = stat(&program, STAT_REPLY_BY_STEERING);
    let (verdict, bytes) = program.test_run(&reply, LOOPBACK).unwrap();
    assert_eq!(verdict, XDP_TX, "toward the client, out of lo");
    assert_eq!(stat(&program, STAT_FAST_SERVER_COOKIE), written + 1);
    assert_eq!(
        stat(&program, STAT_REPLY_BY_STEERING),
        by_steering,
        "found in reply_senders"
    );
    assert_eq!(bytes[26..30], VIP.to_be_bytes(), "leaves from the VIP");

    program
        .set_host_addrs(&[std::net::Ipv4Addr::from(client)])
        .unwrap();
    let (verdict, bytes) = program.test_run(&reply, LOOPBACK).unwrap();
    assert_eq!(verdict, XDP_PASS, "the host's: passed to its kernel");
    assert_eq!(bytes, reply, "unchanged");
    assert_eq!(stat(&program, STAT_FAST_SERVER_COOKIE), written + 1);
}

/// A client's established segment finds its VIP in `vip_slots`, where the publisher put it
/// by the same hash the kernel computes: with `vips`' entry gone the kernel still forwards
/// it, and with the slot emptied too it no longer knows the VIP (goes up).
#[test]
fn a_client_segment_finds_its_vip_by_its_slot() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
    let program = SteeringProgram::load(config.fallback_table_capacity).unwrap();
    let words = program.kernel_words().unwrap();
    let plane =
        ControlPlane::new_with_tables(&config, &Secret([7; 16]), &|layout, _| words.tables(layout))
            .unwrap();
    let shared = plane.shared();
    let server = ServerId(2);
    let msb = 0x1234u16;
    shared
        .msb
        .learn(server, (msb as u32) << 16 | 7, NANOS_PER_SEC);
    let (client, client_port) = (testkit::client_ip(9), 40_000);
    let hash = shared
        .hasher
        .hash(&FlowKey::tcp(client, client_port, VIP, VIP_PORT));
    let cookie = plane.layout().encode(server, hash, msb);
    let frame = TcpFrame::from_client(
        client,
        client_port,
        ACK,
        options::nop_nop_ts(99, (cookie as u32) << 16 | 0x5678),
    )
    .build();
    publish(&program, &plane, &mut Publisher::new(), true);

    let vips = program.try_map("vips").unwrap();
    for key in vips.keys().collect::<Vec<_>>() {
        vips.delete(&key).unwrap();
    }
    let routed = stat(&program, STAT_FAST_CLIENT_COOKIE);
    let (verdict, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_eq!(verdict, XDP_TX, "forwarded by its slot alone");
    assert_eq!(stat(&program, STAT_FAST_CLIENT_COOKIE), routed + 1);
    assert_eq!(bytes[0..6], testkit::server_mac(server.0));

    let slot = vip_slots::slot_of(VIP.to_be_bytes(), VIP_PORT.to_be_bytes()) as u32;
    let empty = vec![0u8; std::mem::size_of::<VipSlot>()];
    program
        .try_map("vip_slots")
        .unwrap()
        .update(&slot.to_ne_bytes(), &empty, MapFlags::ANY)
        .unwrap();
    let other = stat(&program, STAT_UP_OTHER);
    let (_, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_eq!(bytes, frame, "no VIP known: up, unchanged");
    assert_eq!(stat(&program, STAT_UP_OTHER), other + 1);
    assert_eq!(stat(&program, STAT_FAST_CLIENT_COOKIE), routed + 1);
}
