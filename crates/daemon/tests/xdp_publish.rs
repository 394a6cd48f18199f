//! A change of the tables reaches the XDP program atomically (needs root; the program is
//! loaded, not attached): while the publisher flips a VIP between two pools 10^4 times,
//! whose servers also move to other addresses and MACs, packets run through the program
//! without pause on another thread, and every one the kernel forwards leaves exactly as
//! under one of the two publications, never as under half of each. Only a packet whose
//! reads straddle the latch's flip is handed up unchanged (`STAT_UP_PUBLISHING`); one that
//! arrives while a publication is written reads the other copy of the tables and is
//! forwarded (publish_window.rs), which the second test shows with a window held open.
//!
//! Half a change is visible in the bytes: a pool of one publication with the servers of
//! the other sends a connection to a server (`pool[h % n]`) at an address and MAC that
//! neither publication gives it.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use cheetah_core::lb::Ingress;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::types::ServerId;
use cheetah_core::wire::tcp::flags::ACK;
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::xdp_layout::{
    ServerInfo, FALLBACK_WAYS, SERVER_ID_SPACE, STAT_UP_PUBLISHING,
};
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher, Wanted};
use libbpf_rs::MapCore;

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/on_loopback.rs"]
mod on_loopback;
use on_loopback::{lo, stat, LOOPBACK, ROUTES_VIA_LO, XDP_TX};

const FLIPS: usize = 10_000;
const CLIENTS: u32 = 64;

/// `mode` (hash or maglev) with NAT (the kernel picks `pool[h % n]`, or the VIP's Maglev
/// table, for every segment and writes the server's address and MAC): `pool` of servers
/// 1-4, at addresses and MACs of `subnet`.
fn tables(mode: &str, subnet: u8, pool: &[u16]) -> Wanted {
    let servers: String = (1..=4u8)
        .map(|id| {
            format!(
                "[[servers]]\nid = {id}\ndip = \"10.{subnet}.0.{id}\"\nmac = \"02:ce:00:00:{subnet:02x}:{id:02x}\"\n"
            )
        })
        .collect();
    let config = LbConfig::from_toml(&format!(
        "mode = \"{mode}\"\nforwarding = \"nat\"\n{servers}\
         [[vips]]\naddress = \"{}\"\nport = {VIP_PORT}\nservers = {pool:?}\n",
        Ipv4Addr::from(VIP)
    ))
    .unwrap();
    let plane = ControlPlane::new(&config, &Secret([7; 16])).unwrap();
    let snapshot = plane.shared().snapshot.load();
    let lo = lo();
    let publication = Publication {
        snapshot: &snapshot,
        layout: plane.layout(),
        interfaces: &[lo],
        sides: &[Ingress::ServerSide],
        fast_path: true,
        fallback_sets: plane.shared().fallback.sets(),
    };
    wanted(&publication, ROUTES_VIA_LO, "")
}

/// What the kernel sends for each frame under `tables`, published alone.
fn outputs(program: &SteeringProgram, frames: &[Vec<u8>], tables: &Wanted) -> Vec<Vec<u8>> {
    let mut publisher = Publisher::new();
    publisher.write(program, tables.clone()).unwrap();
    frames
        .iter()
        .map(|frame| {
            let (verdict, bytes) = program.test_run(frame, LOOPBACK).unwrap();
            assert_eq!(verdict, XDP_TX, "forwarded by the kernel, back out of lo");
            assert!(testkit::checksums_valid(&bytes));
            bytes
        })
        .collect()
}

#[derive(Debug, Default)]
struct Seen {
    first: u64,
    second: u64,
    handed_up: u64,
    /// Forwarded bytes that match neither publication: (frame index, bytes).
    mixed: Vec<(usize, Vec<u8>)>,
}

/// One established ACK with NOP NOP TS from each of `CLIENTS` clients.
fn client_acks() -> Vec<Vec<u8>> {
    (0..CLIENTS)
        .map(|n| {
            TcpFrame::from_client(
                testkit::client_ip(n),
                40_000 + n as u16,
                ACK,
                options::nop_nop_ts(n, 0x1234_5678),
            )
            .build()
        })
        .collect()
}

#[test]
fn no_packet_sees_half_of_a_publication() {
    no_packet_sees_half_of_a_publication_in("hash");
}

/// The same with each flip rewriting the VIP's Maglev table in place (maglev_tables.rs).
#[test]
fn no_packet_sees_half_of_a_publication_of_a_maglev_table() {
    no_packet_sees_half_of_a_publication_in("maglev");
}

fn no_packet_sees_half_of_a_publication_in(mode: &str) {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let program = SteeringProgram::load(FALLBACK_WAYS).unwrap();
    // Other addresses, other MACs, another pool (of another size): almost every
    // connection goes elsewhere, and a mix of the two is a third answer.
    let first = tables(mode, 20, &[1, 2, 3, 4]);
    let second = tables(mode, 21, &[3, 1, 2]);
    let frames = client_acks();
    let under_first = outputs(&program, &frames, &first);
    let under_second = outputs(&program, &frames, &second);
    let differ = (0..frames.len())
        .filter(|&i| under_first[i] != under_second[i])
        .count();
    assert_eq!(differ, frames.len(), "every server moved address and MAC");

    // Published by one publisher, which writes only what changed: the servers entries
    // in place, then the VIP, then lb_config.
    let mut publisher = Publisher::new();
    publisher.write(&program, first.clone()).unwrap();
    let raced_before = stat(&program, STAT_UP_PUBLISHING);
    let stop = AtomicBool::new(false);
    let seen = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| {
            let mut seen = Seen::default();
            while !stop.load(Ordering::Relaxed) {
                for (i, frame) in frames.iter().enumerate() {
                    let (_, bytes) = program.test_run(frame, LOOPBACK).unwrap();
                    if bytes == under_first[i] {
                        seen.first += 1;
                    } else if bytes == under_second[i] {
                        seen.second += 1;
                    } else if bytes == *frame {
                        seen.handed_up += 1;
                    } else if seen.mixed.len() < 10 {
                        seen.mixed.push((i, bytes));
                    }
                }
            }
            seen
        });
        for flip in 0..FLIPS {
            let tables = if flip % 2 == 0 { &second } else { &first };
            publisher.write(&program, tables.clone()).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        traffic.join().unwrap()
    });
    let raced = stat(&program, STAT_UP_PUBLISHING) - raced_before;
    eprintln!(
        "{mode}: {FLIPS} publications under traffic: {} packets as the first, {} as the second, \
         {} handed up ({raced} for racing a publication), {} mixed",
        seen.first,
        seen.second,
        seen.handed_up,
        seen.mixed.len()
    );
    for (i, bytes) in &seen.mixed {
        eprintln!(
            "frame {i}: sent {:02x?}\n  first  {:02x?}\n  second {:02x?}",
            &bytes[..42],
            &under_first[*i][..42],
            &under_second[*i][..42]
        );
    }
    assert!(seen.mixed.is_empty(), "packets saw half a publication");
    assert!(
        seen.first > 0 && seen.second > 0,
        "the traffic saw both publications"
    );
    assert_eq!(raced, seen.handed_up, "every hand-up was for racing");
    // The seqlock this replaced handed up every packet inside a window: about one in
    // eight here (docs/dataplane.md). The latch, only those straddling a flip.
    let sent = seen.first + seen.second + seen.handed_up;
    assert!(
        raced * 100 < sent,
        "{raced} of {sent} packets went up for racing a publication: more than a flip's worth"
    );
}

/// The latch's point, with a publication held half written: while the `servers` entries
/// move in the copy packets do not read, packets are forwarded in the kernel as before
/// (none goes up, where the seqlock handed up every one); after the flip they follow the
/// copy just written; after the second write, both copies agree.
#[test]
fn packets_inside_a_publication_are_forwarded_from_the_other_copy() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    let program = SteeringProgram::load(FALLBACK_WAYS).unwrap();
    let before = tables("hash", 20, &[1, 2, 3, 4]);
    // The same pool, every server at another address and MAC.
    let moved = tables("hash", 21, &[1, 2, 3, 4]);
    let frames = client_acks();
    let under_moved = outputs(&program, &frames, &moved);
    // Published last, into both copies: what packets start from.
    let under_before = outputs(&program, &frames, &before);
    assert!((0..frames.len()).all(|i| under_before[i] != under_moved[i]));
    let send_all = |expected: &[Vec<u8>], when: &str| {
        for (i, frame) in frames.iter().enumerate() {
            let (verdict, bytes) = program.test_run(frame, LOOPBACK).unwrap();
            assert_eq!(verdict, XDP_TX, "{when}: frame {i} forwarded in the kernel");
            assert_eq!(bytes, expected[i], "{when}: frame {i}");
        }
    };
    let raced = stat(&program, STAT_UP_PUBLISHING);
    let servers = program.try_map("servers").unwrap();
    let write_servers = |copy: u32| {
        for (key, value) in &moved.servers {
            let index = u32::from_ne_bytes(key[..4].try_into().unwrap());
            let key = copy * SERVER_ID_SPACE as u32 + index;
            servers
                .update(&key.to_ne_bytes(), value, libbpf_rs::MapFlags::ANY)
                .unwrap();
        }
    };

    let mut window = program.publish_window().unwrap();
    write_servers(window.before_write());
    send_all(&under_before, "half written");
    assert!(window.flip());
    send_all(&under_moved, "flipped");
    // What a restart would find had the publisher been killed here: the copy packets read.
    for (key, value) in &moved.servers {
        let id = u32::from_ne_bytes(key[..4].try_into().unwrap()) as u16;
        let dip = std::mem::offset_of!(ServerInfo, dip);
        let moved_dip = Ipv4Addr::from(<[u8; 4]>::try_from(&value[dip..dip + 4]).unwrap());
        assert_eq!(
            program.published_server_dip(ServerId(id)).unwrap(),
            Some(moved_dip),
            "server {id}: the published address is the copy packets read"
        );
    }
    write_servers(window.before_write());
    assert!(!window.flip());
    drop(window);
    send_all(&under_moved, "published");
    assert_eq!(
        stat(&program, STAT_UP_PUBLISHING),
        raced,
        "no packet went up for the publication"
    );
}
