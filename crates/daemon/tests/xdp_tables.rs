//! The daemon's side of the in-kernel path, against the real program (loaded, not
//! attached; needs root): the control plane's clock table lives in the program's mmapped
//! arrays, and what the publisher (`dataplane/xdp_tables.rs`) writes is enough for the
//! kernel to forward an established client segment and a NAT backend's reply as the core
//! would; with `datapath = "afxdp"` it forwards nothing.

use cheetah_core::config::Mode;
use cheetah_core::config::{ConfiguredState, Forwarding};
use cheetah_core::cookie::msb::KNOWN;
use cheetah_core::hash::{FlowKey, Secret};
use cheetah_core::lb::Ingress;
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::{ControlPlane, ServerSpec};
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::types::{ServerId, NANOS_PER_SEC};
use cheetah_core::wire::tcp::flags::ACK;
use cheetah_daemon::dataplane::maglev_tables;
use cheetah_daemon::dataplane::vip_slots;
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::xdp_layout::{
    Encode, MaglevChunk, NextHop, NextHopKey, VipSlot, NEXT_HOP_KNOWN, PUBLISH_COPIES,
    SCHEDULE_CHUNKS, SCHEDULE_CHUNK_BUDGET, STAT_DROP_NO_SERVER_AVAILABLE_PICK,
    STAT_DROP_SERVER_REMOVED_GENERAL, STAT_DROP_TS_MSB_UNKNOWN, STAT_DROP_VIP_PORT_UNKNOWN,
    STAT_FAST_CLIENT_COOKIE, STAT_FAST_CLIENT_PICK, STAT_FAST_SERVER_COOKIE,
    STAT_REPLY_BY_STEERING, STAT_UP_LAYOUT, STAT_UP_OTHER, VIP_SLOTS,
};
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};
use libbpf_rs::{MapCore, MapFlags};

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/on_loopback.rs"]
mod on_loopback;
use on_loopback::{lo, stat, LOOPBACK, ROUTES_VIA_LO, XDP_TX};

const XDP_DROP: u32 = 1;
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
    let unknown = stat(&program, STAT_DROP_TS_MSB_UNKNOWN);
    let (action, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_eq!(
        (action, bytes == frame),
        (XDP_DROP, true),
        "an unknown clock: dropped as the core drops it (ts_msb_unknown)"
    );
    assert_eq!(stat(&program, STAT_DROP_TS_MSB_UNKNOWN), unknown + 1);

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
    // Every client behind lo (the next hop from the map, not the host's FIB), in both
    // copies of the tables (a /0 after the copy's 32 bits).
    let everywhere = |copy| NextHopKey {
        prefixlen: 32,
        copy,
        addr: [0; 4],
    };
    let via_lo = NextHop {
        kind: NEXT_HOP_KNOWN,
        ifindex: LOOPBACK,
        mtu: 1500,
        dmac: [2, 0, 0, 0, 0xc1, 1],
        smac: [0; 6],
    };
    for copy in 0..PUBLISH_COPIES as u32 {
        program
            .try_map("next_hops")
            .unwrap()
            .update(
                &everywhere(copy).to_bytes(),
                &via_lo.to_bytes(),
                MapFlags::ANY,
            )
            .unwrap();
    }

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

    let slot = vip_slots::slot_of(VIP.to_be_bytes(), VIP_PORT.to_be_bytes());
    let empty = vec![0u8; std::mem::size_of::<VipSlot>()];
    for copy in 0..PUBLISH_COPIES {
        let key = (copy * VIP_SLOTS + slot) as u32;
        program
            .try_map("vip_slots")
            .unwrap()
            .update(&key.to_ne_bytes(), &empty, MapFlags::ANY)
            .unwrap();
    }
    // No VIP at its address and port, where vips holds every VIP (LB_EVERY_VIP): dropped
    // as the core drops a segment to a port no VIP is on, unchanged.
    let unknown = stat(&program, STAT_DROP_VIP_PORT_UNKNOWN);
    let (verdict, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_eq!((verdict, bytes), (XDP_DROP, frame), "no VIP known");
    assert_eq!(stat(&program, STAT_DROP_VIP_PORT_UNKNOWN), unknown + 1);
    assert_eq!(stat(&program, STAT_FAST_CLIENT_COOKIE), routed + 1);
}

/// Chunk 0 of VIP `index`'s table in the kernel (`None`: no table), the same in both
/// copies of the tables.
fn first_chunk(program: &SteeringProgram, index: u32) -> Option<Vec<u8>> {
    let chunk = |copy| {
        let inner = maglev_tables::table_map(program, copy, index).unwrap()?;
        inner.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).unwrap()
    };
    let first = chunk(0);
    assert_eq!(
        chunk(1),
        first,
        "VIP {index}'s table differs between the copies"
    );
    first
}

/// A chunk no table holds (server 0x7777 in every slot), to see whether a publication
/// wrote a table again.
const MARK: [u8; 64] = [0x77; 64];

fn mark(program: &SteeringProgram, index: u32) {
    for copy in 0..PUBLISH_COPIES {
        let inner = maglev_tables::table_map(program, copy, index)
            .unwrap()
            .unwrap();
        inner
            .update(&0u32.to_ne_bytes(), &MARK, MapFlags::ANY)
            .unwrap();
    }
}

fn chunk_bytes(chunk: &MaglevChunk) -> Vec<u8> {
    chunk
        .server
        .iter()
        .flat_map(|id| id.to_ne_bytes())
        .collect()
}

/// Maglev mode: each VIP's table is in the kernel, slot for slot the core's; the kernel
/// forwards a client segment where the core's table says; a pool change rewrites only its
/// own VIP's table, a publication that changes no pool rewrites none, and a VIP whose pool
/// empties loses its table (its packets are then dropped: `no_server_available`).
#[test]
fn the_publisher_writes_a_maglev_table_only_when_its_pool_changed() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let mut config = testkit::config(Mode::Maglev, Forwarding::L2, PolicyKind::Maglev, 5);
    config.vips[0].servers = vec![1, 2, 3];
    let mut other = config.vips[0].clone();
    other.port = VIP_PORT + 1;
    other.servers = vec![4, 5];
    config.vips.push(other);
    let program = SteeringProgram::load(config.fallback_table_capacity).unwrap();
    let mut plane = ControlPlane::new(&config, &Secret([7; 16])).unwrap();
    let mut publisher = Publisher::new();
    publish(&program, &plane, &mut publisher, true);

    // The kernel's table is the core's, and it forwards by it.
    let snapshot = plane.shared().snapshot.load();
    let table = &snapshot.vip(0).pool.maglev;
    let inner = maglev_tables::table_map(&program, 0, 0).unwrap().unwrap();
    let chunks = maglev_tables::chunks(table);
    assert_eq!(inner.max_entries() as usize, chunks.len());
    for (index, chunk) in chunks.iter().enumerate().step_by(97) {
        let bytes = inner
            .lookup(&(index as u32).to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .unwrap();
        assert_eq!(bytes, chunk_bytes(chunk), "chunk {index}");
    }
    let picked = stat(&program, STAT_FAST_CLIENT_PICK);
    for n in 0..32 {
        let (client, client_port) = (testkit::client_ip(n), 40_000 + n as u16);
        let hash = plane
            .shared()
            .hasher
            .hash(&FlowKey::tcp(client, client_port, VIP, VIP_PORT));
        let server = table.lookup(hash).unwrap();
        let frame =
            TcpFrame::from_client(client, client_port, ACK, options::nop_nop_ts(99, 7)).build();
        let (verdict, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
        assert_eq!(verdict, XDP_TX, "client {n}");
        assert_eq!(bytes[0..6], testkit::server_mac(server.0), "client {n}");
    }
    assert_eq!(stat(&program, STAT_FAST_CLIENT_PICK), picked + 32);

    // Nothing changed: nothing is written.
    mark(&program, 0);
    mark(&program, 1);
    publish(&program, &plane, &mut publisher, true);
    assert_eq!(first_chunk(&program, 0).unwrap(), MARK);
    assert_eq!(first_chunk(&program, 1).unwrap(), MARK);

    // VIP 0's pool changes: its table is written again, VIP 1's is not.
    plane.drain_server(3).unwrap();
    publish(&program, &plane, &mut publisher, true);
    let changed = std::sync::Arc::clone(&plane.shared().snapshot.load().vip(0).pool.maglev);
    assert_ne!(&changed, table);
    assert_eq!(
        first_chunk(&program, 0).unwrap(),
        chunk_bytes(&maglev_tables::chunks(&changed)[0]),
        "VIP 0's table rewritten"
    );
    assert_eq!(
        first_chunk(&program, 1).unwrap(),
        MARK,
        "VIP 1's left alone"
    );

    // VIP 1's pool empties: its table goes, and its packets are dropped.
    plane.drain_server(4).unwrap();
    plane.drain_server(5).unwrap();
    publish(&program, &plane, &mut publisher, true);
    assert_eq!(first_chunk(&program, 1), None);
    let mut frame = TcpFrame::from_client(
        testkit::client_ip(1),
        40_000,
        ACK,
        options::nop_nop_ts(99, 7),
    );
    frame.dst_port = VIP_PORT + 1;
    let frame = frame.build();
    let dropped = stat(&program, STAT_DROP_NO_SERVER_AVAILABLE_PICK);
    let (verdict, bytes) = program.test_run(&frame, LOOPBACK).unwrap();
    assert_eq!(
        (verdict, bytes),
        (XDP_DROP, frame),
        "no server: dropped unchanged, as the core drops it"
    );
    assert_eq!(
        stat(&program, STAT_DROP_NO_SERVER_AVAILABLE_PICK),
        dropped + 1
    );

    // A fresh publisher (a restarted daemon) knows nothing it wrote: it writes every
    // table and empties every other slot.
    mark(&program, 0);
    publish(&program, &plane, &mut Publisher::new(), true);
    assert_eq!(
        first_chunk(&program, 0).unwrap(),
        chunk_bytes(&maglev_tables::chunks(&changed)[0])
    );
    assert_eq!(first_chunk(&program, 1), None);
}

/// With NAT, a server's segment that no current backend explains (here a fragment of a
/// current backend's reply: the core reads no ports from it) is the core's `Pass`, so the
/// kernel gives it to the host's stack rather than to a worker; once a removed server had
/// the same DIP (the server removed, then back under a new id at the same address), the
/// core drops it as `server_removed`, and so does the kernel.
#[test]
fn a_nat_backends_fragment_is_the_hosts_unless_a_removed_server_had_its_dip() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let (program, mut plane, mut publisher) = nat_lb();
    let server = ServerId(2);
    let fragment = more_fragments(&nat_reply(server));

    let passed = program.stats().passed_to_host;
    let up = stat(&program, STAT_UP_OTHER) + stat(&program, STAT_UP_LAYOUT);
    let (verdict, bytes) = program.test_run(&fragment, LOOPBACK).unwrap();
    assert_eq!(
        (verdict, &bytes),
        (XDP_PASS, &fragment),
        "the host's, unchanged"
    );
    assert_eq!(program.stats().passed_to_host, passed + 1);
    assert_eq!(
        stat(&program, STAT_UP_OTHER) + stat(&program, STAT_UP_LAYOUT),
        up,
        "not handed to a worker"
    );

    let dip = plane.shared().snapshot.load().servers.get(server).dip;
    plane.remove_server(server.0, 0).unwrap();
    add_server_at(&mut plane, dip);
    publish(&program, &plane, &mut publisher, true);
    let removed = stat(&program, STAT_DROP_SERVER_REMOVED_GENERAL);
    let (verdict, bytes) = program.test_run(&fragment, LOOPBACK).unwrap();
    assert_eq!(
        (verdict, &bytes),
        (XDP_DROP, &fragment),
        "a removed server's DIP"
    );
    assert_eq!(
        stat(&program, STAT_DROP_SERVER_REMOVED_GENERAL),
        removed + 1
    );
    assert_eq!(program.stats().passed_to_host, passed + 1);
}

/// With NAT, replies come from backends, and no server that forwards may have a VIP's
/// address (the control plane refuses it): a segment from a VIP address is forged, and
/// the core passes it to the host, unless a removed server had the address (a quarantine
/// kept across a restart whose config put a VIP there): dropped as `server_removed`.
#[test]
fn a_nat_segment_from_a_vip_address_is_the_hosts() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let (program, mut plane, mut publisher) = nat_lb();
    let mut forged = nat_reply(ServerId(2));
    forged[26..30].copy_from_slice(&VIP.to_be_bytes());
    let forged = with_ip_checksum(&forged);
    let run = |expected: u32, what: &str| {
        let (verdict, bytes) = program.test_run(&forged, LOOPBACK).unwrap();
        assert_eq!((verdict, &bytes), (expected, &forged), "{what}");
    };

    let passed = program.stats().passed_to_host;
    run(XDP_PASS, "the host's, unchanged");
    assert_eq!(program.stats().passed_to_host, passed + 1);

    let other = stat(&program, STAT_UP_OTHER);
    plane
        .restore_quarantine(&testkit::removed_server_state(9, VIP), 0)
        .unwrap();
    publish(&program, &plane, &mut publisher, true);
    let removed = stat(&program, STAT_DROP_SERVER_REMOVED_GENERAL);
    run(XDP_DROP, "a removed server's address");
    assert_eq!(
        stat(&program, STAT_DROP_SERVER_REMOVED_GENERAL),
        removed + 1
    );
    assert_eq!(stat(&program, STAT_UP_OTHER), other);
    assert_eq!(program.stats().passed_to_host, passed + 1);
}

/// A NAT LB: the program with the control plane's tables published, and the publisher
/// that publishes the plane's changes.
fn nat_lb() -> (SteeringProgram, ControlPlane, Publisher) {
    let config = testkit::config(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 3);
    let program = SteeringProgram::load(config.fallback_table_capacity).unwrap();
    let words = program.kernel_words().unwrap();
    let plane =
        ControlPlane::new_with_tables(&config, &Secret([7; 16]), &|layout, _| words.tables(layout))
            .unwrap();
    let mut publisher = Publisher::new();
    publish(&program, &plane, &mut publisher, true);
    (program, plane, publisher)
}

/// A new server at `dip` (an address as a u32), in the VIP's pool.
fn add_server_at(plane: &mut ControlPlane, dip: u32) -> ServerId {
    let vip = format!("{}:{VIP_PORT}", std::net::Ipv4Addr::from(VIP));
    plane
        .add_server(
            ServerSpec {
                id: None,
                dip: std::net::Ipv4Addr::from(dip).into(),
                mac: Some("02:ce:00:00:09:09".into()),
                vips: vec![(vip, 1)],
                state: ConfiguredState::Active,
            },
            0,
        )
        .unwrap()
}

/// `server`'s established reply to a client, as a NAT backend sends it.
fn nat_reply(server: ServerId) -> Vec<u8> {
    TcpFrame::from_server_nat(
        server.0,
        testkit::client_ip(9),
        40_000,
        ACK,
        options::nop_nop_ts(0x1234_0042, 77),
    )
    .build()
}

/// `frame` (untagged IPv4) as the first fragment of its datagram: MF set, checksum fixed.
fn more_fragments(frame: &[u8]) -> Vec<u8> {
    let mut out = frame.to_vec();
    out[14 + 6] = 0x20;
    out[14 + 7] = 0;
    with_ip_checksum(&out)
}

/// `frame` (untagged IPv4) with its header checksum computed again.
fn with_ip_checksum(frame: &[u8]) -> Vec<u8> {
    let mut out = frame.to_vec();
    let ip = 14;
    out[ip + 10..ip + 12].fill(0);
    let sum = out[ip..ip + 20]
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], pair[1]])))
        .sum::<u32>();
    let folded = (sum & 0xffff) + (sum >> 16);
    let checksum = !(((folded & 0xffff) + (folded >> 16)) as u16);
    out[ip + 10..ip + 12].copy_from_slice(&checksum.to_be_bytes());
    out
}

/// wrr cycles in chunks up to the budget, then every VIP's index moves by one (a VIP
/// before them): the copy being written holds its new chunks before its stale ones go,
/// beside the other copy's. The map must take them all, or the publication fails.
#[test]
fn wrr_chunks_that_all_move_at_once_fit_the_map() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    // 64 servers of weight 1 and one of 524,224: a cycle of SCHEDULE_MAX_LEN entries, 31
    // chunks beyond the first; 33 such VIPs take 1,023 of a copy's 1,024 chunks.
    let chunked_vips = SCHEDULE_CHUNK_BUDGET / (SCHEDULE_CHUNKS - 1);
    let mut config = testkit::config(
        Mode::Cheetah,
        Forwarding::L2,
        PolicyKind::WeightedRoundRobin,
        65,
    );
    config.vips[0].weights = (1..=65u16)
        .map(|id| (id.to_string(), if id == 65 { 524_224 } else { 1 }))
        .collect();
    let first = config.vips[0].clone();
    config.vips = (0..chunked_vips as u16)
        .map(|n| {
            let mut vip = first.clone();
            vip.port = 1000 + n;
            vip
        })
        .collect();
    let mut moved = config.clone();
    let mut before = first.clone();
    before.port = 999;
    before.weights.clear();
    before.policy = PolicyKind::RoundRobin;
    moved.vips.insert(0, before);

    let program = SteeringProgram::load(config.fallback_table_capacity).unwrap();
    let mut publisher = Publisher::new();
    let chunks = |program: &SteeringProgram| {
        program
            .try_map("wrr_schedule_chunks")
            .unwrap()
            .keys()
            .count()
    };
    let in_copies = PUBLISH_COPIES * chunked_vips * (SCHEDULE_CHUNKS - 1);
    for config in [&config, &moved] {
        let plane = ControlPlane::new(config, &Secret([7; 16])).unwrap();
        publish(&program, &plane, &mut publisher, true);
        assert_eq!(chunks(&program), in_copies, "every copy holds every chunk");
    }
}
