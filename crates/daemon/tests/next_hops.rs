//! The next-hop mirror (`dataplane::next_hops`) with the real kernel: a server's reply
//! handled by the XDP program takes its next hop toward the client from `next_hops`
//! (`STAT_NEXT_HOP_MISS` unchanged), follows a change of the gateway's MAC as soon as the
//! kernel announces it, and is left to `bpf_fib_lookup` wherever the map cannot answer for
//! the kernel. Needs root: it loads the XDP program and makes a network namespace of its
//! own (the test thread's, `unshare`), as xdp_parity.rs does.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::lb::Ingress;
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::types::Mac;
use cheetah_core::wire::tcp::flags;
use cheetah_daemon::dataplane::next_hops::NextHopMirror;
use cheetah_daemon::dataplane::xdp::{SteeringProgram, SteeringStats};
use cheetah_daemon::dataplane::xdp_layout::UP_REASONS;
use cheetah_daemon::dataplane::xdp_layout::{FALLBACK_WAYS, STAT_UP_NEXT_HOP};
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};
use cheetah_daemon::dataplane::Interface;

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
#[path = "shared/lb_namespace.rs"]
mod lb_namespace;
use ip_command::ip;
use lb_namespace::{enter_lb_namespace, interface, Veth};
#[path = "shared/this_cpu.rs"]
mod this_cpu;
use this_cpu::pin_to_this_cpu;

const SERVERS: Veth = Veth {
    name: "xn-srv",
    mac: [0x02, 0x1c, 0x00, 0x00, 0x00, 0x05],
    peer: "xn-srv-p",
};
const CLIENTS: Veth = Veth {
    name: "xn-cli",
    mac: [0x02, 0x1c, 0x00, 0x00, 0x00, 0x0c],
    peer: "xn-cli-p",
};
const GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x00, 0x01];
const MOVED_GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x00, 0x02];
/// What `cheetah run` promises (docs/dataplane.md "Next hops"): a change the kernel
/// announces is in the map within one round of its loop, anything else within a second.
const REFRESH_BOUND: Duration = Duration::from_secs(1);
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

/// This thread in a namespace of its own: `lo` forwarding (as `cheetah run` sets it), the
/// servers behind one veth, the clients behind a gateway on the other.
fn enter_new_namespace() -> [Interface; 2] {
    enter_lb_namespace(&SERVERS, &CLIENTS, &GATEWAY_MAC);
    [interface(&SERVERS, 0), interface(&CLIENTS, 1)]
}

/// The program with a plain-hash l2 LB published (replies need no clock), as `cheetah
/// run` publishes it.
fn load(interfaces: &[Interface; 2]) -> (SteeringProgram, ControlPlane) {
    let program = SteeringProgram::load(FALLBACK_WAYS).expect("the verifier refused bpf/xdp_lb.c");
    for interface in interfaces {
        program
            .set_interface_slot(interface.ifindex, interface.slot)
            .unwrap();
    }
    let config = testkit::config(Mode::Hash, Forwarding::L2, PolicyKind::Hash, 2);
    let plane = ControlPlane::new(&config, &Secret(*b"next-hops-secret")).unwrap();
    let snapshot = plane.shared().snapshot.load();
    let publication = Publication {
        snapshot: &snapshot,
        layout: plane.shared().layout(),
        interfaces,
        sides: &[Ingress::ServerSide, Ingress::ClientSide],
        fast_path: true,
        fallback_sets: plane.shared().fallback.sets(),
    };
    // This thread's namespace's tables: /proc/net is the process's first thread's.
    let routes = std::fs::read_to_string(Path::new("/proc/thread-self/net/route")).unwrap();
    let neighbours = std::fs::read_to_string(Path::new("/proc/thread-self/net/arp")).unwrap();
    Publisher::new()
        .write(&program, wanted(&publication, &routes, &neighbours))
        .expect("publish the tables");
    (program, plane)
}

/// A server 1 segment to the client at `client`, through the program as received on the
/// servers' interface: its action, destination MAC, and the counters before and after.
fn reply(
    program: &SteeringProgram,
    servers: &Interface,
    client: Ipv4Addr,
) -> (u32, Mac, SteeringStats, SteeringStats) {
    reply_of_len(program, servers, client, 152)
}

/// [`reply`] with an IP packet of `ip_len` bytes (at least 52: IP, TCP and its options).
fn reply_of_len(
    program: &SteeringProgram,
    servers: &Interface,
    client: Ipv4Addr,
    ip_len: usize,
) -> (u32, Mac, SteeringStats, SteeringStats) {
    let frame = TcpFrame::from_server_l2(
        1,
        u32::from(client),
        40_000,
        flags::ACK,
        options::nop_nop_ts(0x1234_5678, 0x0102_0304),
    )
    .with_payload(&vec![0x42; ip_len - 52])
    .build();
    let before = program.stats();
    let (action, out) = program.test_run(&frame, servers.ifindex).unwrap();
    let after = program.stats();
    // An XDP_REDIRECT leaves the frame where it was: no metadata in front.
    (action, out[0..6].try_into().unwrap(), before, after)
}

fn up_next_hop(stats: &SteeringStats) -> u64 {
    let at = UP_REASONS
        .iter()
        .position(|(index, _)| *index == STAT_UP_NEXT_HOP)
        .unwrap();
    stats.up[at]
}

#[test]
fn replies_take_their_next_hop_from_the_mirror_and_follow_a_new_gateway_mac() {
    if !is_root() {
        eprintln!("\n*** SKIPPED next_hops: needs root (loads the XDP program, makes a network namespace) ***\n");
        return;
    }
    let interfaces = enter_new_namespace();
    let (program, _plane) = load(&interfaces);
    let servers = &interfaces[0];
    let client = Ipv4Addr::new(10, 2, 0, 7);

    // The map empty: the FIB answers, and says so.
    let (action, dst, before, after) = reply(&program, servers, client);
    assert_eq!((action, dst), (XDP_REDIRECT, GATEWAY_MAC));
    assert_eq!(after.next_hop_miss, before.next_hop_miss + 1);

    let mut mirror = NextHopMirror::new().expect("netlink");
    mirror.refresh(&program).expect("mirror the next hops");
    let (action, dst, before, after) = reply(&program, servers, client);
    assert_eq!((action, dst), (XDP_REDIRECT, GATEWAY_MAC));
    assert_eq!(
        after.next_hop_miss, before.next_hop_miss,
        "the reply's next hop did not come from next_hops"
    );

    // The gateway's MAC moves: the kernel announces it, the mirror follows.
    lb_namespace::set_gateway_mac(CLIENTS.name, &MOVED_GATEWAY_MAC);
    let moved = Instant::now();
    loop {
        // What `cheetah run` does each round of its loop (and once a second regardless).
        if mirror.changed() {
            mirror.refresh(&program).expect("mirror the next hops");
        }
        let (action, dst, before, after) = reply(&program, servers, client);
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(after.next_hop_miss, before.next_hop_miss);
        if dst == MOVED_GATEWAY_MAC {
            break;
        }
        assert_eq!(dst, GATEWAY_MAC);
        assert!(
            moved.elapsed() < REFRESH_BOUND,
            "replies still go to the gateway's old MAC {:?} after the change",
            moved.elapsed()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "next_hops: the new MAC was in use {:?} after the change",
        moved.elapsed()
    );

    // A client on the clients' own subnet (an on-link route): its own neighbour entry's
    // MAC, from next_hop_hosts, once the kernel has one.
    let on_link = Ipv4Addr::new(10, 7, 0, 9);
    let (_, _, before, after) = reply(&program, servers, on_link);
    assert_eq!(after.next_hop_miss, before.next_hop_miss + 1);
    ip(&[
        "neigh",
        "replace",
        "10.7.0.9",
        "lladdr",
        "02:c9:00:00:00:09",
        "nud",
        "reachable",
        "dev",
        CLIENTS.name,
    ]);
    mirror.refresh(&program).expect("mirror the next hops");
    let (action, dst, before, after) = reply(&program, servers, on_link);
    assert_eq!((action, dst), (XDP_REDIRECT, [0x02, 0xc9, 0, 0, 0, 9]));
    assert_eq!(after.next_hop_miss, before.next_hop_miss);

    // A more specific route through a gateway without a neighbour entry: the map must not
    // answer with the default route's gateway. The FIB says NO_NEIGH; the reply goes up.
    ip(&[
        "route",
        "add",
        "10.2.9.0/24",
        "via",
        "10.7.0.3",
        "dev",
        CLIENTS.name,
    ]);
    let started = Instant::now();
    while !mirror.changed() && started.elapsed() < REFRESH_BOUND {
        std::thread::sleep(Duration::from_millis(5));
    }
    mirror.refresh(&program).expect("mirror the next hops");
    let (action, _, before, after) = reply(&program, servers, Ipv4Addr::new(10, 2, 9, 7));
    assert_ne!(action, XDP_REDIRECT);
    assert_eq!(after.next_hop_miss, before.next_hop_miss + 1);
    assert_eq!(up_next_hop(&after), up_next_hop(&before) + 1);
    // Its neighbour resolved: the map answers for it too.
    ip(&[
        "neigh",
        "replace",
        "10.7.0.3",
        "lladdr",
        "02:c9:00:00:00:03",
        "nud",
        "reachable",
        "dev",
        CLIENTS.name,
    ]);
    mirror.refresh(&program).expect("mirror the next hops");
    let (action, dst, before, after) = reply(&program, servers, Ipv4Addr::new(10, 2, 9, 7));
    assert_eq!((action, dst), (XDP_REDIRECT, [0x02, 0xc9, 0, 0, 0, 3]));
    assert_eq!(after.next_hop_miss, before.next_hop_miss);
}

/// Waits for the kernel to announce a routing change, then mirrors it, as `cheetah run`
/// does each round of its loop.
fn follow_change(mirror: &mut NextHopMirror, program: &SteeringProgram) {
    let started = Instant::now();
    while !mirror.changed() && started.elapsed() < REFRESH_BOUND {
        std::thread::sleep(Duration::from_millis(5));
    }
    mirror.refresh(program).expect("mirror the next hops");
}

#[test]
fn a_reply_follows_a_route_change_while_the_cache_holds_the_old_answer() {
    if !is_root() {
        eprintln!("\n*** SKIPPED next_hops: needs root (loads the XDP program, makes a network namespace) ***\n");
        return;
    }
    let interfaces = enter_new_namespace();
    let (program, _plane) = load(&interfaces);
    let servers = &interfaces[0];
    let client = Ipv4Addr::new(10, 2, 0, 7);
    let mut mirror = NextHopMirror::new().expect("netlink");
    mirror.refresh(&program).expect("mirror the next hops");

    // The first reply reads the trie and fills this CPU's slot; the second is the cache's.
    // (One CPU for the test run: the cache is per CPU.)
    // BPF_PROG_TEST_RUN runs the program on this CPU, and the next-hop cache is per CPU.
    pin_to_this_cpu();
    let (action, dst, _, _) = reply(&program, servers, client);
    assert_eq!((action, dst), (XDP_REDIRECT, GATEWAY_MAC));
    let (action, dst, before, after) = reply(&program, servers, client);
    assert_eq!((action, dst), (XDP_REDIRECT, GATEWAY_MAC));
    assert_eq!(
        after.next_hop_cache_miss, before.next_hop_cache_miss,
        "the second reply toward the client did not take its next hop from the cache"
    );

    // A more specific route moves the client behind a router on the servers' side: the
    // reply leaves by the interface it came in on (XDP_TX), toward that router's MAC.
    let router_mac: Mac = [0x02, 0xc9, 0x00, 0x00, 0x01, 0x09];
    ip(&[
        "neigh",
        "replace",
        "10.1.0.9",
        "lladdr",
        &lb_namespace::mac_text(&router_mac),
        "nud",
        "permanent",
        "dev",
        SERVERS.name,
    ]);
    ip(&[
        "route",
        "add",
        "10.2.0.0/24",
        "via",
        "10.1.0.9",
        "dev",
        SERVERS.name,
    ]);
    follow_change(&mut mirror, &program);
    let (action, dst, before, after) = reply(&program, servers, client);
    assert_eq!(
        (action, dst),
        (XDP_TX, router_mac),
        "the reply after the route change kept the cached next hop"
    );
    assert_eq!(after.next_hop_miss, before.next_hop_miss);
    assert_eq!(after.next_hop_cache_miss, before.next_hop_cache_miss + 1);
    let (action, dst, before, after) = reply(&program, servers, client);
    assert_eq!((action, dst), (XDP_TX, router_mac));
    assert_eq!(after.next_hop_cache_miss, before.next_hop_cache_miss);

    // And back: the route gone, the cache's answer (the router) is void again.
    ip(&["route", "del", "10.2.0.0/24"]);
    follow_change(&mut mirror, &program);
    let (action, dst, _, _) = reply(&program, servers, client);
    assert_eq!(
        (action, dst),
        (XDP_REDIRECT, GATEWAY_MAC),
        "the reply after the route's removal kept the cached next hop"
    );

    // Longer than the route's MTU: the FIB's answer (FRAG_NEEDED), not the cached one.
    ip(&["link", "set", CLIENTS.name, "mtu", "1200"]);
    follow_change(&mut mirror, &program);
    let (action, dst, _, _) = reply(&program, servers, client);
    assert_eq!((action, dst), (XDP_REDIRECT, GATEWAY_MAC));
    let (action, _, before, after) = reply_of_len(&program, servers, client, 1300);
    assert_ne!(action, XDP_REDIRECT, "a reply beyond the MTU was forwarded");
    assert_eq!(after.next_hop_miss, before.next_hop_miss + 1);
}
