//! The kernel's VIP policies (bpf/lib/policy.h, run by `syn_fast` in bpf/lib/fast_path.h)
//! held to the core's: for rr, wrr (unequal weights), random (the same seed), hash, maglev
//! (the VIP's Maglev table, also over a pool bigger than the kernel holds), every policy
//! over a pool bigger than `vip_info` holds (`vip_big_pools`; wrr only from a cycle that
//! fits, over 256 servers too; awrr also from buckets scaled to fit), and
//! least loaded and pow2 over the loads their own picks make, a sequence of SYNs from distinct clients through `BPF_PROG_TEST_RUN` must pick the same
//! servers in the same order as the core's policy instance given the same initial state
//! (every CPU seeded as the core's worker, `PolicySeeds::AsWorker`), with the core's bytes
//! for each pick and the core's counters. Some SYNs are sent twice (a retransmission): the
//! kernel's handshake table must recognise the same ones the core's does. Then the fold
//! (`KernelLoads`) must give the core's load totals what the core's own worker gave its
//! own: +1 active and +1 new connection per pick, -1 active per retransmission's earlier
//! pick. A server's SYN-ACK that first answers a retried SYN moves the count in the kernel
//! as the core's moves it (`on_connection_moved`), with the core's bytes and counters, and
//! the fold then gives the core's loads; a later SYN-ACK, or one to a SYN sent once, is a
//! plain reply. Half-way the core's worker merges and the daemon
//! folds: each CPU's load view is then the totals plus its own picks since, as the worker's.
//!
//! Least loaded and pow2 are also held to the core's over given loads under every metric
//! (the core's `LoadView::set_load`; the daemon's `published_loads` for the kernel), and
//! least loaded on active connections must even the counts out between two folds instead
//! of herding. Published values no fold writes (negative bases, a NaN's bits) and a cursor
//! far beyond the pool still pick a pool member.
//!
//! `BPF_PROG_TEST_RUN` runs the program on the calling CPU, and the policy state is per
//! CPU: the test thread is pinned to one CPU, so every SYN advances the same state.
//!
//! Needs root (loads the XDP program, makes a network namespace of its own).

use std::net::Ipv4Addr;
use std::sync::Arc;

use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Counter, Ingress, SharedTables, Worker, WorkerConfig};
use cheetah_core::policy::awrr::{awrr_buckets, AutoWeightedRoundRobin};
use cheetah_core::policy::least_loaded::LeastLoaded;
use cheetah_core::policy::pow2::PowerOfTwo;
use cheetah_core::policy::schedule::{cycle_len, Schedule};
use cheetah_core::policy::{
    LoadMetric, LoadView, PickContext, Policy, PolicyRng, PoolSnapshot, ReportedLoad, WorkerLoads,
    MERGE_INTERVAL,
};
use cheetah_core::tables::ControlPlane;
use cheetah_core::types::{Mac, ServerId};
use cheetah_core::verdict::Verdict;
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::awrr_schedules::AwrrSchedules;
use cheetah_daemon::dataplane::kernel_loads::{published_loads, KernelLoads};
use cheetah_daemon::dataplane::xdp::{SteeringProgram, SteeringStats};
use cheetah_daemon::dataplane::xdp_layout::*;
use cheetah_daemon::dataplane::xdp_policy::PolicySeeds;
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};
use rand_core::SeedableRng;

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
#[path = "shared/lb_namespace.rs"]
mod lb_namespace;
use lb_namespace::{enter_lb_namespace, interface, Veth};
#[path = "shared/this_cpu.rs"]
mod this_cpu;
use this_cpu::pin_to_this_cpu;

const SERVERS: Veth = Veth {
    name: "pp-srv",
    mac: [0x02, 0x1b, 0x00, 0x00, 0x01, 0x05],
    peer: "pp-srv-p",
};
const CLIENTS: Veth = Veth {
    name: "pp-cli",
    mac: [0x02, 0x1b, 0x00, 0x00, 0x01, 0x0c],
    peer: "pp-cli-p",
};
const GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x01, 0x01];

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const VIP_PORT: u16 = 80;
/// Distinct clients, each sending one SYN; every `RETRANSMIT_EVERY`th sends it twice.
const CLIENTS_COUNT: u32 = 1200;
const RETRANSMIT_EVERY: u32 = 50;
/// Not the default worker seed: the kernel's generator must be seeded from the worker's.
const RNG_SEED: u64 = 0x0bad_5eed_1234_5678;
/// The core's `now` for every SYN (mid-way through a retry-filter unit of 2^30 ns).
const NOW: u64 = 1_000_000_000_000 + (1 << 29);
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

fn server_mac(id: u16) -> Mac {
    [0x02, 0x00, 0x00, 0x01, (id >> 8) as u8, id as u8]
}

/// Enters this test's LB namespace; false (the test is skipped, loudly) without root, which
/// loading the XDP program and making a namespace need.
fn in_lb_namespace() -> bool {
    if !is_root() {
        eprintln!("\n*** SKIPPED xdp_policy_parity: needs root (loads the XDP program, makes a network namespace) ***\n");
        return false;
    }
    enter_lb_namespace(&SERVERS, &CLIENTS, &GATEWAY_MAC);
    true
}

/// A cheetah-mode l2 config: one VIP of `policy` over servers 1..=n, with `weights`.
fn config(policy: &str, n: u16, weights: &[(u16, u32)]) -> LbConfig {
    config_with(policy, "", n, weights)
}

/// [`config`] with `vip_extra` lines in the VIP's table.
fn config_with(policy: &str, vip_extra: &str, n: u16, weights: &[(u16, u32)]) -> LbConfig {
    LbConfig::from_toml(&config_text(policy, vip_extra, n, weights))
        .unwrap_or_else(|e| panic!("{policy}: {e}"))
}

/// The text of [`config_with`]'s config.
fn config_text(policy: &str, vip_extra: &str, n: u16, weights: &[(u16, u32)]) -> String {
    let mut text = String::from(
        "mode = \"cheetah\"\nforwarding = \"l2\"\ncookie_epoch_bits = 4\nfallback_table_capacity = 4096\n",
    );
    for id in 1..=n {
        let mac = server_mac(id).map(|b| format!("{b:02x}")).join(":");
        text += &format!(
            "[[servers]]\nid = {id}\ndip = \"10.1.{}.{}\"\nmac = \"{mac}\"\nstate = \"active\"\n",
            id >> 8,
            id & 0xff
        );
    }
    let members: Vec<String> = (1..=n).map(|id| id.to_string()).collect();
    text += &format!(
        "[[vips]]\naddress = \"{VIP}\"\nport = {VIP_PORT}\npolicy = \"{policy}\"\n{vip_extra}\nservers = [{}]\n[vips.weights]\n",
        members.join(", ")
    );
    for (id, weight) in weights {
        text += &format!("\"{id}\" = {weight}\n");
    }
    text
}

fn checksum(words: impl Iterator<Item = u16>) -> u16 {
    let mut sum: u32 = words.map(u32::from).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn be_words(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))
}

/// One end of a TCP segment: its MAC, address and port.
#[derive(Clone, Copy)]
struct End {
    mac: Mac,
    addr: Ipv4Addr,
    port: u16,
}

/// A handshake segment with Linux's options (MSS SAckOK TS NOP WScale, Table 1's first
/// row) from `from` to `to`.
fn handshake_segment(from: End, to: End, flags: u8, seq: u32, ack: u32, tsval: u32) -> Vec<u8> {
    let ts = tsval.to_be_bytes();
    let options = [
        2, 4, 0x05, 0xb4, 4, 2, 8, 10, ts[0], ts[1], ts[2], ts[3], 0, 0, 0, 0, 1, 3, 3, 7,
    ];
    segment(from, to, flags, seq, ack, &options)
}

/// A TCP segment from `from` to `to` with `options` (a multiple of 4 bytes), checksums
/// set.
fn segment(from: End, to: End, flags: u8, seq: u32, ack: u32, options: &[u8]) -> Vec<u8> {
    let tcp_len = 20 + options.len();
    let mut frame = Vec::new();
    frame.extend_from_slice(&to.mac);
    frame.extend_from_slice(&from.mac);
    frame.extend_from_slice(&0x0800u16.to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0];
    ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
    ip.extend_from_slice(&from.addr.octets());
    ip.extend_from_slice(&to.addr.octets());
    let ip_check = checksum(be_words(&ip));
    ip[10..12].copy_from_slice(&ip_check.to_be_bytes());
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&from.port.to_be_bytes());
    tcp.extend_from_slice(&to.port.to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&ack.to_be_bytes());
    tcp.push(((tcp_len / 4) as u8) << 4);
    tcp.push(flags);
    tcp.extend_from_slice(&[0xfa, 0xf0, 0, 0, 0, 0]);
    tcp.extend_from_slice(options);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&from.addr.octets());
    pseudo.extend_from_slice(&to.addr.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(tcp_len as u16).to_be_bytes());
    pseudo.extend_from_slice(&tcp);
    let tcp_check = checksum(be_words(&pseudo));
    tcp[16..18].copy_from_slice(&tcp_check.to_be_bytes());
    frame.extend_from_slice(&ip);
    frame.extend_from_slice(&tcp);
    frame
}

const TCP_SYN: u8 = 0x02;
const TCP_SYN_ACK: u8 = 0x12;
const TCP_FIN_ACK: u8 = 0x11;

fn vip_end(mac: Mac) -> End {
    End {
        mac,
        addr: VIP,
        port: VIP_PORT,
    }
}

/// The MAC a client's segment arrives from (the clients' router, as the kernel sees it).
const CLIENT_ROUTER_MAC: Mac = [0x02, 0xaa, 0, 0, 0, 1];

/// A client's SYN to the VIP.
fn syn(client: Ipv4Addr, port: u16, isn: u32) -> Vec<u8> {
    let from = End {
        mac: CLIENT_ROUTER_MAC,
        addr: client,
        port,
    };
    handshake_segment(from, vip_end(SERVERS.mac), TCP_SYN, isn, 0, 0x1234_5678)
}

/// Client `i`'s SYN: from 10.7.(i / 250).(i % 250 + 1).
fn client_syn(i: u32) -> Vec<u8> {
    let client = Ipv4Addr::new(10, 7, 1 + (i / 250) as u8, (i % 250 + 1) as u8);
    syn(
        client,
        40_000 + (i % 20_000) as u16,
        0x1000_0000 ^ i.wrapping_mul(2_654_435_761),
    )
}

/// The SYNs of the run, in order: client `i`'s, a retransmission (the same SYN) after
/// every `RETRANSMIT_EVERY`th.
fn syns() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..CLIENTS_COUNT {
        let frame = client_syn(i);
        out.push(frame.clone());
        if i % RETRANSMIT_EVERY == 0 {
            out.push(frame);
        }
    }
    out
}

/// What one policy's run gave.
struct Run {
    kernel_picks: Vec<u16>,
    core_picks: Vec<u16>,
    /// The kernel's SYN stats: placed, and recognised as retransmitted.
    kernel_syns: (u64, u64),
    /// The core worker's new_connections and syn_retransmissions.
    core_syns: (u64, u64),
    byte_mismatches: Vec<usize>,
    /// Active connections and new connections per server, in the core's totals after the
    /// worker merged, and in the kernel plane's totals after the fold.
    core_loads: Vec<(u64, u64)>,
    kernel_loads: Vec<(u64, u64)>,
    cpu_state_advanced: bool,
    /// This CPU's schedule cursor moved: the kernel picked from a cycle.
    schedule_cursor_moved: bool,
}

/// The program loaded and published for `config`, with two planes over the config: the
/// kernel's, its tables over the program's words and its loads what the fold gives them;
/// and the core's, with tables of its own (the kernel books every SYN in its handshake
/// table first, so a shared one would show the core each SYN as a retransmission) and its
/// loads what its worker gives them. Every CPU's policy state is the core worker's.
struct Lb {
    program: SteeringProgram,
    kernel_plane: ControlPlane,
    core_plane: ControlPlane,
    worker_config: WorkerConfig,
    servers_ifindex: u32,
}

fn set_up(config: &LbConfig) -> Lb {
    set_up_as(config, 0)
}

/// [`set_up`] with every CPU's policy state and the core's worker those of worker
/// `worker` (of `worker + 1`).
fn set_up_as(config: &LbConfig, worker: usize) -> Lb {
    let secret = Secret([0x5a; 16]);
    let program = SteeringProgram::load(config.fallback_table_capacity)
        .expect("the verifier refused bpf/xdp_lb.c");
    let servers = interface(&SERVERS, 0);
    let clients = interface(&CLIENTS, 1);
    program.set_interface_slot(servers.ifindex, 0).unwrap();
    program.set_interface_slot(clients.ifindex, 1).unwrap();
    let words = program.kernel_words().unwrap();
    let kernel_plane =
        ControlPlane::new_with_tables(config, &secret, &|layout, _| words.tables(layout)).unwrap();
    let core_plane = ControlPlane::new_with_tables(config, &secret, &SharedTables::new).unwrap();
    let snapshot = kernel_plane.shared().snapshot.load();
    let servers_ifindex = servers.ifindex;
    let interfaces = [servers, clients];
    let publication = Publication {
        snapshot: &snapshot,
        layout: kernel_plane.shared().layout(),
        interfaces: &interfaces,
        sides: &[Ingress::ServerSide, Ingress::ClientSide],
        fast_path: true,
        fallback_sets: kernel_plane.shared().fallback.sets(),
    };
    let mut worker_config = WorkerConfig::new(worker, worker + 1, config);
    worker_config.seed = RNG_SEED;
    let mut publisher = Publisher::with_policy_seeds(PolicySeeds::AsWorker {
        index: worker_config.index,
        workers: worker_config.workers,
        rng_seed: worker_config.seed,
    });
    let routes = std::fs::read_to_string("/proc/thread-self/net/route").unwrap();
    let neighbours = std::fs::read_to_string("/proc/thread-self/net/arp").unwrap();
    publisher
        .write(&program, wanted(&publication, &routes, &neighbours))
        .unwrap();
    publisher.seed_policies(&program, &snapshot).unwrap();
    program
        .set_clock_base(monotonic_ns().wrapping_sub(NOW))
        .unwrap();
    Lb {
        program,
        kernel_plane,
        core_plane,
        worker_config,
        servers_ifindex,
    }
}

/// The server whose MAC a frame the kernel sent is addressed to.
fn picked(frame: &[u8], servers: u16) -> u16 {
    let dst: Mac = frame[0..6].try_into().unwrap();
    (1..=servers).find(|id| server_mac(*id) == dst).unwrap_or(0)
}

fn run_policy(config: &LbConfig) -> Run {
    run_policy_as(config, 0)
}

/// [`run_policy`] as worker `worker` ([`set_up_as`]).
fn run_policy_as(config: &LbConfig, worker: usize) -> Run {
    let Lb {
        program,
        kernel_plane,
        core_plane,
        worker_config,
        servers_ifindex,
    } = set_up_as(config, worker);
    let mut worker = Worker::new(Arc::clone(core_plane.shared()), worker_config);

    let cpu = pin_to_this_cpu();
    let state_before = program.policy_state(0).unwrap()[cpu];
    let rng_before = program.policy_rng().unwrap()[cpu];
    let stats_before = program.stats();
    let mut run = Run {
        kernel_picks: Vec::new(),
        core_picks: Vec::new(),
        kernel_syns: (0, 0),
        core_syns: (0, 0),
        byte_mismatches: Vec::new(),
        core_loads: Vec::new(),
        kernel_loads: Vec::new(),
        cpu_state_advanced: false,
        schedule_cursor_moved: false,
    };
    let mut kernel_loads = KernelLoads::new(Arc::clone(&kernel_plane.shared().loads));
    let frames = syns();
    let half = frames.len() / 2;
    let mut now = NOW;
    for (n, frame) in frames.iter().enumerate() {
        if n == half {
            // Half-way, the core's worker merges and the daemon folds: from then on each
            // side's view is its totals (equal, as checked at the end) plus its own picks.
            now += MERGE_INTERVAL;
            worker.tick(now);
            kernel_loads.fold(&program, kernel_plane.shared()).unwrap();
        }
        let (action, out) = program.test_run(frame, servers_ifindex).unwrap();
        let mut core_out = frame.clone();
        let verdict = worker.process(&mut core_out, now, Ingress::ServerSide);
        let Verdict::ToServer(core_pick) = verdict else {
            panic!("SYN {n}: the core says {verdict:?}");
        };
        run.core_picks.push(core_pick.0);
        if action != XDP_TX {
            run.kernel_picks.push(0);
            continue;
        }
        run.kernel_picks
            .push(picked(&out, config.servers.len() as u16));
        core_out[0..6].copy_from_slice(&server_mac(core_pick.0));
        core_out[6..12].copy_from_slice(&SERVERS.mac);
        if out != core_out {
            run.byte_mismatches.push(n);
        }
    }
    let stats = program.stats();
    let kernel = |i: usize| stats.fast[i] - stats_before.fast[i];
    // FAST_BUNDLES: ClientSyn at 4, ClientSynRetransmitted at 5.
    run.kernel_syns = (kernel(4) + kernel(5), kernel(5));
    let counters = worker.counters();
    run.core_syns = (
        counters.get(Counter::NewConnections),
        counters.get(Counter::SynRetransmissions),
    );
    let state_after = program.policy_state(0).unwrap()[cpu];
    run.cpu_state_advanced =
        state_after != state_before || program.policy_rng().unwrap()[cpu] != rng_before;
    run.schedule_cursor_moved = state_after.schedule_cursor != state_before.schedule_cursor;

    worker.tick(now + MERGE_INTERVAL);
    kernel_loads.fold(&program, kernel_plane.shared()).unwrap();
    for id in 1..=config.servers.len() as u16 {
        let load = |plane: &ControlPlane| {
            let load = plane.shared().loads.server(ServerId(id));
            (load.active_connections, load.new_connections)
        };
        run.core_loads.push(load(&core_plane));
        run.kernel_loads.push(load(&kernel_plane));
    }
    run
}

/// The first place two pick sequences differ, for the failure message.
fn first_difference(kernel: &[u16], core: &[u16]) -> String {
    match kernel.iter().zip(core).position(|(k, c)| k != c) {
        Some(at) => format!(
            "first at SYN {at}: kernel {:?}, core {:?}",
            &kernel[at..(at + 8).min(kernel.len())],
            &core[at..(at + 8).min(core.len())]
        ),
        None => "none".into(),
    }
}

/// Weights 1, 2, 3, 4, 5, 1, 2, .. for servers 1 to `n`.
fn weights_1_to_5(n: u16) -> Vec<(u16, u32)> {
    (1..=n).map(|id| (id, 1 + u32::from(id - 1) % 5)).collect()
}

fn one_to_forty(n: u16) -> Vec<(u16, u32)> {
    (1..=n).map(|id| (id, 1 + u32::from(id - 1) % 40)).collect()
}

#[test]
fn kernel_policies_pick_the_cores_servers_in_the_cores_order() {
    if !in_lb_namespace() {
        return;
    }
    let wrr_weights = [(1, 5), (2, 1), (3, 3), (4, 2), (5, 7), (6, 1), (7, 4)];
    // Odd weights 1, 3, .., 127: a cycle of 64^2 entries.
    let odd_weights: Vec<(u16, u32)> = (1..=MAX_HASH_POOL as u16)
        .map(|id| (id, 2 * u32::from(id) - 1))
        .collect();
    // A cycle of 16,400 entries: over the cap, so the kernel scans the credits.
    let over_the_cap = [(1, 16_300), (2, 97), (3, 3)];
    let cases = [
        ("rr", config("rr", 7, &[])),
        ("wrr", config("wrr", 7, &wrr_weights)),
        (
            "wrr, 64 servers",
            config("wrr", MAX_HASH_POOL as u16, &odd_weights),
        ),
        ("wrr, over the cap", config("wrr", 3, &over_the_cap)),
        // No load known: every server's buckets are the balanced ones.
        ("awrr", config("awrr", 7, &[])),
        ("random", config("random", 7, &[])),
        ("hash", config("hash", 7, &[])),
        // The biggest pool vip_info holds itself.
        (
            "random, 64 servers",
            config("random", MAX_HASH_POOL as u16, &[]),
        ),
        ("rr, 64 servers", config("rr", MAX_HASH_POOL as u16, &[])),
        // Over the loads each side's picks make: the kernel's view must see its own.
        ("least-loaded", config("least-loaded", 7, &[])),
        (
            "least-loaded, 64 servers",
            config("least-loaded", MAX_HASH_POOL as u16, &[]),
        ),
        ("pow2", config("pow2", 7, &[])),
        // Over MAX_HASH_POOL: the pool from the VIP's vip_big_pools entry.
        (
            "rr, 65 servers",
            config("rr", MAX_HASH_POOL as u16 + 1, &[]),
        ),
        // wrr from its cycle alone (the credits' state holds 64 positions): weights 1 to 5
        // over 200 servers, a cycle of 600.
        ("wrr, 200 servers", config("wrr", 200, &weights_1_to_5(200))),
        // Positions beyond a byte (16-bit in struct vip_schedule): weights 1 to 5 over 300
        // servers, a cycle of 900 entries, which the run's 1,224 SYNs go around once.
        ("wrr, 300 servers", config("wrr", 300, &weights_1_to_5(300))),
        // awrr from its balanced cycle (no load known), over the 819 servers whose buckets
        // always fit (the run's 1,224 SYNs are not a whole number of its cycles, or the
        // cursor would end where it began).
        ("awrr, 2000 servers", config("awrr", 2000, &[])),
        ("random, 300 servers", config("random", 300, &[])),
        ("hash, 300 servers", config("hash", 300, &[])),
        ("pow2, 300 servers", config("pow2", 300, &[])),
        (
            "least-loaded, 300 servers",
            config("least-loaded", 300, &[]),
        ),
        // The most servers the cookie carries with 4 epoch bits.
        ("rr, 4095 servers", config("rr", 4095, &[])),
        // By the published Maglev table, which holds a pool of any size.
        ("maglev", config("maglev", 7, &[])),
        (
            "maglev, 100 servers",
            config("maglev", MAX_HASH_POOL as u16 + 36, &[]),
        ),
    ];
    // Every case as worker 0 of 1, and a cycle over SCHEDULE_CAP, read from its chunks:
    // weights 1 to 40 over 1,000 servers make one of 20,500. As worker 16,000 the run's
    // 1,224 SYNs cross from the first entries into chunk 1; as worker 20,000 from chunk 1
    // round to the first entries.
    let mut cases: Vec<(&str, LbConfig, usize)> = cases
        .into_iter()
        .map(|(name, config)| (name, config, 0))
        .collect();
    for (name, worker) in [
        ("wrr, 1000 servers, into a chunk", 16_000),
        ("wrr, 1000 servers, out of a chunk", 20_000),
    ] {
        cases.push((name, config("wrr", 1000, &one_to_forty(1000)), worker));
    }
    let mut failures = Vec::new();
    for (name, config, worker) in &cases {
        let run = run_policy_as(config, *worker);
        let scheduled = run.schedule_cursor_moved;
        if name.starts_with("wrr") && scheduled == name.ends_with("over the cap") {
            failures.push(format!(
                "{name}: the kernel {} its cycle",
                if scheduled {
                    "picked from"
                } else {
                    "did not pick from"
                }
            ));
        }
        let syns = run.core_picks.len();
        let placed = run.kernel_picks.iter().filter(|&&p| p != 0).count();
        eprintln!(
            "{name:<20} {syns} SYNs, {placed} placed in the kernel; kernel SYN stats {:?}, core (new_connections, syn_retransmissions) {:?}",
            run.kernel_syns, run.core_syns
        );
        let mut fail = |what: String| failures.push(format!("{name}: {what}"));
        if placed != syns {
            fail(format!("{} of {syns} SYNs went up", syns - placed));
        }
        if run.kernel_picks != run.core_picks {
            fail(format!(
                "the kernel picked other servers than the core: {}",
                first_difference(&run.kernel_picks, &run.core_picks)
            ));
        }
        if !run.byte_mismatches.is_empty() {
            fail(format!(
                "bytes differ from the core's for SYNs {:?}",
                &run.byte_mismatches[..run.byte_mismatches.len().min(10)]
            ));
        }
        if run.kernel_syns != run.core_syns {
            fail(format!(
                "kernel counted (SYNs, retransmitted) {:?}, the core {:?}",
                run.kernel_syns, run.core_syns
            ));
        }
        if run.kernel_loads != run.core_loads {
            fail(format!(
                "the fold gave (active, new) per server {:?}, the core's worker {:?}",
                run.kernel_loads, run.core_loads
            ));
        }
        let placed_total: u64 = run.kernel_loads.iter().map(|(_, new)| new).sum();
        if placed_total != syns as u64 {
            fail(format!(
                "the fold counted {placed_total} new connections for {syns} kernel picks"
            ));
        }
        // hash and maglev keep no state.
        if !run.cpu_state_advanced && !name.starts_with("hash") && !name.starts_with("maglev") {
            fail("this CPU's policy state did not move: the picks ran elsewhere".into());
        }
    }
    // A pool the kernel does not hold goes up, counted as a new connection for userspace:
    // one over MAX_HASH_POOL for a policy with state per position, unless wrr's cycle is
    // one the kernel reads (at most SCHEDULE_MAX_LEN entries, in chunks); awrr's always
    // is. Odd weights 1, 3, .., 127 and one of 600,000: a cycle of 604,096 entries.
    // Weights 1 to 250 over 4,000 servers: one of 502,000, but 250 distinct weights would
    // take 125.5 M steps to write it out, over MAX_CYCLE_STEPS.
    let odd_65: Vec<(u16, u32)> = (1..=MAX_HASH_POOL as u16 + 1)
        .map(|id| {
            let weight = if usize::from(id) > MAX_HASH_POOL {
                600_000
            } else {
                2 * u32::from(id) - 1
            };
            (id, weight)
        })
        .collect();
    let one_to_250: Vec<(u16, u32)> = (1..=4000)
        .map(|id| (id, 1 + u32::from(id - 1) % 250))
        .collect();
    for (name, config) in [
        (
            "wrr, 65 servers, a cycle over the most the kernel reads",
            config("wrr", MAX_HASH_POOL as u16 + 1, &odd_65),
        ),
        (
            "wrr, 4000 servers, a cycle too costly to write out",
            config("wrr", 4000, &one_to_250),
        ),
    ] {
        let run = run_policy(&config);
        if run.kernel_picks.iter().any(|&p| p != 0) {
            failures.push(format!("{name}: placed in the kernel"));
        }
    }
    assert!(
        failures.is_empty(),
        "the kernel's policies disagree with the core's:\n{}",
        failures.join("\n")
    );
}

/// Hash mode (a baseline) places every client segment by `pool[h % n]` in the kernel, from
/// the VIP's vip_big_pools entry for a pool over MAX_HASH_POOL: the core's server and
/// bytes for each.
#[test]
fn hash_mode_picks_from_a_pool_bigger_than_vip_info_holds_as_the_core_does() {
    if !in_lb_namespace() {
        return;
    }
    let servers = 300;
    let text =
        config_text("hash", "", servers, &[]).replace("mode = \"cheetah\"", "mode = \"hash\"");
    let config = LbConfig::from_toml(&text).unwrap();
    let lb = set_up(&config);
    let mut worker = Worker::new(Arc::clone(lb.core_plane.shared()), lb.worker_config);
    let mut picks = std::collections::BTreeSet::new();
    for (n, frame) in syns().iter().enumerate() {
        let (action, out) = lb.program.test_run(frame, lb.servers_ifindex).unwrap();
        let mut core_out = frame.clone();
        let verdict = worker.process(&mut core_out, NOW, Ingress::ServerSide);
        let Verdict::ToServer(core_pick) = verdict else {
            panic!("segment {n}: the core says {verdict:?}");
        };
        assert_eq!(action, XDP_TX, "segment {n} went up");
        assert_eq!(picked(&out, servers), core_pick.0, "segment {n}");
        core_out[0..6].copy_from_slice(&server_mac(core_pick.0));
        core_out[6..12].copy_from_slice(&SERVERS.mac);
        assert!(out == core_out, "segment {n}: bytes differ from the core's");
        picks.insert(core_pick.0);
    }
    // Positions beyond vip_info's 64 were read.
    assert!(
        picks.iter().any(|&id| id > MAX_HASH_POOL as u16),
        "{picks:?}"
    );
}

#[test]
fn a_syn_ack_after_a_retried_syn_moves_the_count_in_the_kernel_as_the_core_does() {
    if !in_lb_namespace() {
        return;
    }
    let config = config("rr", 7, &[]);
    let lb = set_up(&config);
    // The core's worker over tables of its own, seeded as the kernel's CPUs: it sees the
    // same SYNs and SYN-ACKs and picks the same servers.
    let mut worker = Worker::new(Arc::clone(lb.core_plane.shared()), lb.worker_config);
    let mut kernel_loads = KernelLoads::new(Arc::clone(&lb.kernel_plane.shared().loads));
    pin_to_this_cpu();
    // Every server's clock known, as after its first replies: no SYN-ACK learns one.
    let msb = 0x0042u32;
    let clocks: Vec<(ServerId, u32)> = (1..=7).map(|id| (ServerId(id), msb << 16)).collect();
    lb.kernel_plane.shared().msb.import(&clocks, 0);
    lb.core_plane.shared().msb.import(&clocks, 0);
    let servers = config.servers.len() as u16;
    let client = |host: u8| End {
        mac: GATEWAY_MAC,
        addr: Ipv4Addr::new(10, 7, 9, host),
        port: 50_000,
    };
    let syn_ack = |server: u16, to: End, isn: u32| {
        let from = vip_end(server_mac(server));
        let to = End {
            mac: SERVERS.mac,
            ..to
        };
        handshake_segment(
            from,
            to,
            TCP_SYN_ACK,
            7,
            isn.wrapping_add(1),
            msb << 16 | 0x0123,
        )
    };
    // The kernel's verdict on `frame` and the STAT_FAST_* it moved, then the core's bytes
    // for it (a reply's as the kernel sends them: toward the gateway from the clients'
    // interface).
    let both = |worker: &mut Worker, frame: &[u8]| {
        let stats = lb.program.stats();
        let (action, out) = lb.program.test_run(frame, lb.servers_ifindex).unwrap();
        let after = lb.program.stats();
        let mut core_out = frame.to_vec();
        let verdict = worker.process(&mut core_out, NOW, Ingress::ServerSide);
        if verdict == Verdict::ToClient {
            core_out[0..6].copy_from_slice(&GATEWAY_MAC);
            core_out[6..12].copy_from_slice(&CLIENTS.mac);
        }
        (action, out, after, stats, verdict, core_out)
    };
    // The delta of STAT_FAST_* entry `stat` between two reads of the stats.
    let delta = |after: &SteeringStats, before: &SteeringStats, stat: u32| {
        let at = FAST_EVENTS.iter().position(|(s, _)| *s == stat).unwrap();
        after.events[at] - before.events[at]
    };

    // Client 1's SYN, retransmitted: two picks, the second holding the count.
    let isn = 0x0c0f_fee0;
    let first_syn = syn(client(1).addr, client(1).port, isn);
    let (_, first, ..) = both(&mut worker, &first_syn);
    let (_, second, ..) = both(&mut worker, &first_syn);
    let (first, second) = (picked(&first, servers), picked(&second, servers));
    assert!(
        first != 0 && second != 0 && first != second,
        "rr picks {first} then {second}"
    );
    // The first pick answers first: the kernel moves the count to it, as the core does.
    let (action, out, after, before, verdict, core_out) =
        both(&mut worker, &syn_ack(first, client(1), isn));
    assert_eq!(verdict, Verdict::ToClient);
    assert_eq!(action, XDP_REDIRECT, "the kernel handled the SYN-ACK");
    assert_eq!(
        delta(&after, &before, STAT_ANSWER_MOVED),
        1,
        "counted as a move"
    );
    // FAST_BUNDLES: ServerCookie at 2, the SYN-ACK's own entry beside the move.
    assert_eq!(after.fast[2] - before.fast[2], 1, "a reply with a cookie");
    assert_eq!(worker.counters().get(Counter::HandshakeCountMoved), 1);
    assert_eq!(out, core_out, "the core's bytes (cookie in TSval)");
    // The second pick's late SYN-ACK moves nothing, in either.
    let (action, _, after, before, _, _) = both(&mut worker, &syn_ack(second, client(1), isn));
    assert_eq!(action, XDP_REDIRECT);
    // FAST_BUNDLES: ServerCookie at 2.
    assert_eq!(after.fast[2] - before.fast[2], 1, "a plain reply");
    assert_eq!(worker.counters().get(Counter::HandshakeCountMoved), 1);

    // Client 2's SYN, sent once: its SYN-ACK is a plain reply.
    let isn = 0x0bad_cafe;
    let (_, out, ..) = both(&mut worker, &syn(client(2).addr, client(2).port, isn));
    let server = picked(&out, servers);
    let (action, out, after, before, _, core_out) =
        both(&mut worker, &syn_ack(server, client(2), isn));
    assert_eq!(
        after.fast[2] - before.fast[2],
        1,
        "the kernel handled the SYN-ACK"
    );
    assert_eq!(action, XDP_REDIRECT);
    assert_eq!(out, core_out, "the core's bytes (cookie in TSval)");

    let client_end = |host: u8| End {
        mac: CLIENT_ROUTER_MAC,
        ..client(host)
    };
    // The first answer to a retried SYN, without a timestamp, from `answering` to
    // client `host`: it teaches the fallback table, in the kernel as in the core, and
    // moves the count (`moves`: 1) or not; the client's next segment, without options,
    // goes to that server.
    let answer_without_timestamp =
        |worker: &mut Worker, host: u8, isn: u32, answering: u16, moves: u64| {
            let mss_only = segment(
                vip_end(server_mac(answering)),
                End {
                    mac: SERVERS.mac,
                    ..client(host)
                },
                TCP_SYN_ACK,
                7,
                isn.wrapping_add(1),
                &[2, 4, 0x05, 0xb4],
            );
            let moved_before = worker.counters().get(Counter::HandshakeCountMoved);
            let (action, out, after, before, verdict, core_out) = both(worker, &mss_only);
            assert_eq!(verdict, Verdict::ToClient);
            assert_eq!(action, XDP_REDIRECT, "the kernel handled the SYN-ACK");
            assert_eq!(delta(&after, &before, STAT_ANSWER_MOVED), moves, "a move");
            assert_eq!(
                delta(&after, &before, STAT_FAST_SERVER_FALLBACK_LEARNED),
                1,
                "the fallback table's lesson"
            );
            assert_eq!(
                worker.counters().get(Counter::HandshakeCountMoved),
                moved_before + moves
            );
            assert_eq!(out, core_out, "the core's bytes");
            let bare_ack = segment(
                client_end(host),
                vip_end(SERVERS.mac),
                0x10,
                isn.wrapping_add(1),
                8,
                &[],
            );
            let (action, out, _, _, verdict, _) = both(worker, &bare_ack);
            assert_eq!(verdict, Verdict::ToServer(ServerId(answering)));
            assert_eq!(action, XDP_TX);
            assert_eq!(picked(&out, servers), answering, "routed by what it learnt");
        };
    // Client 3 offers timestamps and retries its SYN (two picks); the first pick runs
    // without timestamps (tcp_timestamps=0) and answers first, without one.
    let isn = 0x0d15_ea5e;
    let (_, out, ..) = both(&mut worker, &syn(client(3).addr, client(3).port, isn));
    let answering = picked(&out, servers);
    let (_, out, ..) = both(&mut worker, &syn(client(3).addr, client(3).port, isn));
    assert_ne!(picked(&out, servers), answering, "rr picks another");
    answer_without_timestamp(&mut worker, 3, isn, answering, 1);
    // Client 5 offers none (a Windows client) and retries its SYN: the fallback table
    // sends the retry where the first went, so the answer moves nothing.
    let isn = 0x0bad_d00d;
    let bare_syn = segment(client_end(5), vip_end(SERVERS.mac), TCP_SYN, isn, 0, &[]);
    let (_, out, ..) = both(&mut worker, &bare_syn);
    let answering = picked(&out, servers);
    let (_, out, ..) = both(&mut worker, &bare_syn);
    assert_eq!(picked(&out, servers), answering, "the table's server");
    answer_without_timestamp(&mut worker, 5, isn, answering, 0);

    // Client 4 retries a SYN with timestamps, and the first pick's SYN-ACK also moves
    // its server's clock forward (MSB 0x43 over 0x42): the learn and the move, in the
    // kernel as in the core.
    let isn = 0x0fee_d1e5;
    let (_, out, ..) = both(&mut worker, &syn(client(4).addr, client(4).port, isn));
    let answering = picked(&out, servers);
    both(&mut worker, &syn(client(4).addr, client(4).port, isn));
    let advancing = handshake_segment(
        vip_end(server_mac(answering)),
        End {
            mac: SERVERS.mac,
            ..client(4)
        },
        TCP_SYN_ACK,
        7,
        isn.wrapping_add(1),
        (msb + 1) << 16 | 0x0123,
    );
    let advanced_before = worker.counters().get(Counter::MsbAdvanced);
    let (action, out, after, before, verdict, core_out) = both(&mut worker, &advancing);
    assert_eq!(verdict, Verdict::ToClient);
    assert_eq!(action, XDP_REDIRECT, "the kernel handled the SYN-ACK");
    assert_eq!(delta(&after, &before, STAT_ANSWER_MOVED), 1, "a move");
    assert_eq!(
        delta(&after, &before, STAT_FAST_SERVER_COOKIE_ADVANCED),
        1,
        "beside the clock's advance"
    );
    assert_eq!(
        worker.counters().get(Counter::MsbAdvanced),
        advanced_before + 1
    );
    assert_eq!(out, core_out, "the core's bytes (the new MSB's cookie)");

    // The fold gives the kernel's plane the core's loads: the count on the server that
    // answered, one new connection per pick.
    worker.tick(NOW + MERGE_INTERVAL);
    kernel_loads
        .fold(&lb.program, lb.kernel_plane.shared())
        .unwrap();
    for id in 1..=servers {
        let load = |plane: &ControlPlane| {
            let load = plane.shared().loads.server(ServerId(id));
            (load.active_connections, load.new_connections)
        };
        assert_eq!(
            load(&lb.kernel_plane),
            load(&lb.core_plane),
            "server {id}: (active, new) after the fold"
        );
    }
    let load = lb.kernel_plane.shared().loads.server(ServerId(first));
    assert_eq!((load.active_connections, load.new_connections), (1, 1));
    // Each CPU's own count in its load-view row moved with server_traffic's (the picks,
    // the retried SYN's release, the move): what the fold's bases subtract.
    for id in (1..=servers).map(ServerId) {
        let own = lb.program.own_active(id).unwrap();
        let traffic = lb.program.server_traffic_per_cpu(id).unwrap();
        let deltas: Vec<u64> = traffic
            .iter()
            .map(|cpu| cpu.active_delta() as u64)
            .collect();
        assert_eq!(
            own, deltas,
            "{id:?}: each CPU's own count against server_traffic"
        );
    }
    let own_total = |id: u16| -> u64 {
        let own = lb.program.own_active(ServerId(id)).unwrap();
        own.iter().fold(0, |total, &cpu| total.wrapping_add(cpu))
    };
    assert_eq!((own_total(first), own_total(second)), (1, 0));
}

/// Server `id`'s load under `metric` in the load-aware tests: with ties (every metric
/// gives some servers the same load).
fn given_load(id: u16, metric: LoadMetric) -> f64 {
    match metric {
        LoadMetric::ActiveConnections => f64::from((id * 13) % 9 / 2),
        LoadMetric::Reported => f64::from((id * 7) % 5) * 0.25,
        LoadMetric::Packets => f64::from((id * 5) % 7) * 1000.5,
        LoadMetric::Bytes => f64::from((id * 3) % 4) * 700_000.25,
    }
}

/// Publishes each CPU's view of `view` for servers 1..=n as the daemon's fold does
/// (`published_loads` over the CPUs' current `server_traffic`).
fn publish(program: &SteeringProgram, view: &LoadView, n: u16) {
    for id in (1..=n).map(ServerId) {
        let per_cpu = program.server_traffic_per_cpu(id).unwrap();
        program
            .set_server_load(id, &published_loads(view, id, &per_cpu))
            .unwrap();
    }
}

/// The servers the kernel picked for client SYNs 0..count (0: it went up).
fn kernel_picks(lb: &Lb, servers: u16, count: u32) -> Vec<u16> {
    kernel_picks_of(lb, servers, 0..count)
}

/// The servers the kernel picked for the SYNs of `clients` (0: it went up).
fn kernel_picks_of(lb: &Lb, servers: u16, clients: std::ops::Range<u32>) -> Vec<u16> {
    clients
        .map(|i| {
            let (action, out) = lb
                .program
                .test_run(&client_syn(i), lb.servers_ifindex)
                .unwrap();
            if action == XDP_TX {
                picked(&out, servers)
            } else {
                0
            }
        })
        .collect()
}

/// The core's pick of `policy` over `pool` under `view`'s loads.
fn core_pick(
    policy: &mut dyn Policy,
    pool: &PoolSnapshot,
    view: &LoadView,
    rng: &mut PolicyRng,
) -> ServerId {
    let mut ctx = PickContext {
        pool,
        flow_hash: 0,
        loads: view,
        rng,
        now: NOW,
    };
    policy.pick(&mut ctx).unwrap()
}

#[test]
fn kernel_load_aware_policies_pick_the_cores_servers_given_the_same_loads() {
    if !in_lb_namespace() {
        return;
    }
    let metrics = [
        ("active-connections", LoadMetric::ActiveConnections),
        ("reported", LoadMetric::Reported),
        ("packets", LoadMetric::Packets),
        ("bytes", LoadMetric::Bytes),
    ];
    let mut cases = Vec::new();
    for policy in ["pow2", "least-loaded"] {
        for (metric_name, metric) in metrics {
            let extra = format!("load_metric = \"{metric_name}\"");
            cases.push((
                format!("{policy}, {metric_name}"),
                metric,
                config_with(policy, &extra, 7, &[]),
            ));
        }
        for n in [MAX_HASH_POOL as u16, 1] {
            cases.push((
                format!("{policy}, {n} servers"),
                LoadMetric::ActiveConnections,
                config(policy, n, &[]),
            ));
        }
    }
    let mut failures = Vec::new();
    for (name, metric, config) in &cases {
        let lb = set_up(config);
        let servers = config.servers.len() as u16;
        let mut view = LoadView::new();
        for id in 1..=servers {
            for (_, m) in metrics {
                view.set_load(ServerId(id), m, given_load(id, m));
            }
        }
        publish(&lb.program, &view, servers);
        // The core's policy over the same view, which its picks move as a worker's own
        // picks move its view (`on_new_connection`: +1 active), with the generator and the
        // cursor the kernel's CPUs were seeded from.
        let pool = lb.kernel_plane.shared().snapshot.load().vips[0]
            .pool
            .clone();
        let mut rng = PolicyRng::seed_from_u64(lb.worker_config.seed);
        let mut policy: Box<dyn Policy> = if name.starts_with("pow2") {
            Box::new(PowerOfTwo)
        } else {
            Box::new(LeastLoaded::new(lb.worker_config.index))
        };
        pin_to_this_cpu();
        let kernel = kernel_picks(&lb, servers, CLIENTS_COUNT);
        let mut core = Vec::new();
        for _ in 0..CLIENTS_COUNT {
            let id = core_pick(policy.as_mut(), &pool, &view, &mut rng);
            let active = view.active_connections(id) as f64;
            view.set_load(id, LoadMetric::ActiveConnections, active + 1.0);
            core.push(id.0);
        }
        let placed = kernel.iter().filter(|&&p| p != 0).count();
        eprintln!(
            "{name:<34} {} SYNs, {placed} placed in the kernel",
            core.len()
        );
        if placed != core.len() {
            failures.push(format!("{name}: {} SYNs went up", core.len() - placed));
        }
        if kernel != core {
            failures.push(format!(
                "{name}: the kernel picked other servers than the core: {}",
                first_difference(&kernel, &core)
            ));
        }
        // Least loaded on its own picks evens the counts out instead of sending every SYN
        // between two folds to the server that was least loaded at the first.
        if *metric == LoadMetric::ActiveConnections && name.starts_with("least-loaded") {
            let mut counts = vec![0i64; usize::from(servers) + 1];
            for &p in &kernel {
                counts[usize::from(p)] += 1;
            }
            let finals: Vec<i64> = (1..=servers)
                .map(|id| counts[usize::from(id)] + given_load(id, *metric) as i64)
                .collect();
            let spread = finals.iter().max().unwrap() - finals.iter().min().unwrap();
            if spread > 1 {
                failures.push(format!(
                    "{name}: active connections after the picks range over {spread} ({finals:?}): the kernel herded"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "the kernel's load-aware policies disagree with the core's:\n{}",
        failures.join("\n")
    );
}

/// awrr in the kernel follows the cycle the daemon publishes from its load view at every
/// fold (`KernelLoads::view`, `AwrrSchedules`); the core's awrr, merging the same loads,
/// must pick the same servers in the same order across merges whose buckets change, and
/// the replacements (outside the publish window) must not hand a SYN up.
#[test]
fn kernel_awrr_picks_the_cores_servers_across_merges_of_changing_loads() {
    if !in_lb_namespace() {
        return;
    }
    // (name, config, whether its buckets are over the cap and scaled to fit)
    let cases = [
        (
            "awrr, reported load",
            config_with("awrr", "load_metric = \"reported\"", 7, &[]),
            false,
        ),
        (
            "awrr, 64 servers",
            config_with(
                "awrr",
                "load_metric = \"reported\"",
                MAX_HASH_POOL as u16,
                &[],
            ),
            false,
        ),
        // Over 64 servers, from vip_big_pools (small enough that the 157 SYNs between two
        // merges carry the cursor beyond the balanced cycle of merge 2).
        (
            "awrr, 136 servers",
            config_with("awrr", "load_metric = \"reported\"", 136, &[]),
            false,
        ),
        // Loads whose buckets (7 to 20 over 2,000 servers) make a cycle over SCHEDULE_CAP:
        // both sides pick from the scaled buckets' cycle.
        (
            "awrr, 2000 servers",
            config_with("awrr", "load_metric = \"reported\"", 2000, &[]),
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (name, config, over_the_cap) in &cases {
        let lb = set_up(config);
        let shared = lb.kernel_plane.shared();
        let servers = config.servers.len() as u16;
        let ids: Vec<ServerId> = (1..=servers).map(ServerId).collect();
        let snapshot = shared.snapshot.load();
        let pool = &snapshot.vips[0].pool;
        let mut kernel_loads =
            KernelLoads::starting_at(&lb.program, Arc::clone(&shared.loads)).unwrap();
        let mut schedules = AwrrSchedules::new();
        let mut view = WorkerLoads::new(Arc::clone(&shared.loads));
        view.watch(&ids);
        let mut awrr =
            AutoWeightedRoundRobin::new(pool, lb.worker_config.index, lb.worker_config.workers);
        let mut rng = PolicyRng::seed_from_u64(lb.worker_config.seed);
        let cpu = pin_to_this_cpu();
        let stats_before = lb.program.stats();
        let (mut kernel, mut core, mut cycles) = (Vec::new(), Vec::new(), Vec::new());
        let mut frames = syns().into_iter();
        // Some merge must leave the cursor beyond the new, shorter cycle, or (over the cap)
        // scale the buckets.
        let (mut carried_beyond, mut scaled) = (false, false);
        for merge in 0..6u16 {
            // Loads that move every merge; in merges 2 and 3 even ones (balanced buckets:
            // a cycle of one pick per server, shorter than the cursor), then unchanged.
            let load = |id: u16| match merge {
                2 | 3 => 0.5,
                _ => f64::from((id * 7 + merge * 3) % 11) * 0.1,
            };
            for id in &ids {
                let report = ReportedLoad {
                    load: Some(load(id.0)),
                    active_connections: None,
                };
                shared.loads.report(*id, report).unwrap();
            }
            let loads: Vec<f64> = ids.iter().map(|id| load(id.0)).collect();
            scaled |= cycle_len(&awrr_buckets(&loads)).is_none();
            kernel_loads.fold(&lb.program, shared).unwrap();
            schedules
                .publish(&lb.program, &snapshot, kernel_loads.view())
                .unwrap();
            view.merge(NOW + u64::from(merge) * MERGE_INTERVAL);
            awrr.on_loads_merged(pool, view.view());
            cycles.push(awrr.buckets().to_vec());
            let len = Schedule::of_weights(awrr.buckets()).unwrap().len();
            let cursor = lb.program.policy_state(0).unwrap()[cpu].schedule_cursor;
            eprintln!("merge {merge}: cycle of {len}, cursor {cursor}");
            carried_beyond |= cursor as usize >= len;
            for frame in frames.by_ref().take(157) {
                let (action, out) = lb.program.test_run(&frame, lb.servers_ifindex).unwrap();
                kernel.push(if action == XDP_TX {
                    picked(&out, servers)
                } else {
                    0
                });
                let mut ctx = PickContext {
                    pool,
                    flow_hash: 0,
                    loads: view.view(),
                    rng: &mut rng,
                    now: NOW,
                };
                core.push(awrr.pick(&mut ctx).unwrap().0);
            }
        }
        let distinct = {
            let mut seen = cycles.clone();
            seen.dedup();
            seen.len()
        };
        let placed = kernel.iter().filter(|&&p| p != 0).count();
        let stats = lb.program.stats();
        let at = UP_REASONS
            .iter()
            .position(|(stat, _)| *stat == STAT_UP_PUBLISHING)
            .unwrap();
        let publishing = stats.up[at] - stats_before.up[at];
        eprintln!(
            "{name:<22} {} SYNs over {} merges ({distinct} distinct bucket sets), {placed} placed in the kernel, cpu {cpu}",
            core.len(),
            cycles.len()
        );
        if *over_the_cap && !scaled {
            failures.push(format!("{name}: no merge's buckets were over the cap"));
        }
        if !over_the_cap && !carried_beyond {
            failures.push(format!(
                "{name}: no merge carried the cursor beyond a cycle"
            ));
        }
        if distinct < 4 {
            failures.push(format!("{name}: the loads did not change the buckets"));
        }
        if placed != core.len() {
            failures.push(format!(
                "{name}: {} SYNs went up ({publishing} as publishing)",
                core.len() - placed
            ));
        }
        if kernel != core {
            failures.push(format!(
                "{name}: the kernel picked other servers than the core: {}",
                first_difference(&kernel, &core)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the kernel's awrr disagrees with the core's:\n{}",
        failures.join("\n")
    );
}

#[test]
fn absurd_published_loads_and_cursors_keep_picks_inside_the_pool() {
    if !in_lb_namespace() {
        return;
    }
    // What no fold publishes: a negative or extreme base, a NaN's or -0.0's bits, the
    // words of two different folds mixed.
    let absurd = [
        (i64::MIN, u64::MAX),
        (-5, 0x7ff8_0000_0000_0001),
        (i64::MAX, 0x8000_0000_0000_0000),
        (0, 0xfff0_0000_0000_0000),
    ];
    let mut failures = Vec::new();
    for policy in ["least-loaded", "pow2"] {
        for metric in ["active-connections", "packets", "reported"] {
            let extra = format!("load_metric = \"{metric}\"");
            let config = config_with(policy, &extra, 7, &[]);
            let lb = set_up(&config);
            let cpus = lb.program.possible_cpus().unwrap();
            for id in 1..=7u16 {
                let (active_base, bits) = absurd[usize::from(id) % absurd.len()];
                let value = ServerLoadValue {
                    active_base,
                    reported: bits,
                    packet_rate: bits.rotate_left(u32::from(id)),
                    byte_rate: bits,
                };
                lb.program
                    .set_server_load(ServerId(id), &vec![value; cpus])
                    .unwrap();
            }
            let mut states = lb.program.policy_state(0).unwrap();
            for state in &mut states {
                state.rr_position = u32::MAX;
            }
            lb.program.set_policy_state(0, &states).unwrap();
            pin_to_this_cpu();
            let picks = kernel_picks(&lb, 7, 200);
            if let Some(bad) = picks.iter().find(|&&p| !(1..=7).contains(&p)) {
                failures.push(format!(
                    "{policy}, {metric}: a pick outside the pool or up ({bad}): {picks:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// least loaded over a pool of up to 4,096 servers is picked from a per-CPU cache of the
/// least loaded positions (bpf/lib/least_loaded.h), which this CPU's own picks and closes
/// and every change of the published loads move. Through SYNs, retried SYNs, servers' FINs
/// (each a close: -1 active in both views) and folds (new bases), and then through
/// publications of new packet rates, the kernel must pick the core's servers, SYN for SYN:
/// for a pool vip_info holds, for one in vip_big_pools whose positions span several of the
/// cache's words, and for the biggest pool the cookie carries with 4 epoch bits.
#[test]
fn least_loaded_follows_picks_closes_and_folds_as_the_core_does() {
    if !in_lb_namespace() {
        return;
    }
    for servers in [12, 200, 4095] {
        least_loaded_follows_the_core(servers);
    }
}

fn least_loaded_follows_the_core(servers: u16) {
    let config = config("least-loaded", servers, &[]);
    let lb = set_up(&config);
    let mut worker = Worker::new(Arc::clone(lb.core_plane.shared()), lb.worker_config);
    let mut kernel_loads = KernelLoads::new(Arc::clone(&lb.kernel_plane.shared().loads));
    pin_to_this_cpu();
    let msb = 0x0042u32;
    let clocks: Vec<(ServerId, u32)> = (1..=servers).map(|id| (ServerId(id), msb << 16)).collect();
    lb.kernel_plane.shared().msb.import(&clocks, 0);
    lb.core_plane.shared().msb.import(&clocks, 0);
    let mut now = NOW;
    // Open connections: (client, isn, server).
    let mut open: Vec<(End, u32, u16)> = Vec::new();
    let (mut kernel_picks, mut core_picks) = (Vec::new(), Vec::new());
    let mut closes = 0;
    for i in 0..1500u32 {
        if i % 250 == 249 {
            // A fold: the kernel's bases move and its caches must fill again; the core's
            // worker merges the same totals.
            now += MERGE_INTERVAL;
            worker.tick(now);
            kernel_loads
                .fold(&lb.program, lb.kernel_plane.shared())
                .unwrap();
        }
        // Close about as often as open, in bursts, from anywhere in the open set.
        let spin = i.wrapping_mul(2_654_435_761);
        if spin % 7 < 3 {
            for _ in 0..1 + spin % 3 {
                if open.is_empty() {
                    break;
                }
                let (client, isn, server) = open.swap_remove((spin as usize >> 8) % open.len());
                let ts = (msb << 16 | 0x0200).to_be_bytes();
                let options = [1, 1, 8, 10, ts[0], ts[1], ts[2], ts[3], 0, 0, 0, 1];
                let to = End {
                    mac: SERVERS.mac,
                    ..client
                };
                let fin = segment(
                    vip_end(server_mac(server)),
                    to,
                    TCP_FIN_ACK,
                    7,
                    isn.wrapping_add(1),
                    &options,
                );
                let (action, _) = lb.program.test_run(&fin, lb.servers_ifindex).unwrap();
                let mut core_out = fin.clone();
                let verdict = worker.process(&mut core_out, now, Ingress::ServerSide);
                assert_eq!(verdict, Verdict::ToClient, "FIN {closes}");
                assert_eq!(action, XDP_REDIRECT, "FIN {closes}: the kernel took it");
                closes += 1;
            }
        }
        let client = End {
            mac: [0x02, 0xaa, 0, 0, 0, 1],
            addr: Ipv4Addr::new(10, 8, 1 + (i / 250) as u8, (i % 250 + 1) as u8),
            port: 30_000 + i as u16,
        };
        let isn = 0x2000_0000 ^ spin;
        let frame = syn(client.addr, client.port, isn);
        // Every 9th SYN is sent twice: the retry releases the first pick's count.
        for _ in 0..1 + u32::from(i % 9 == 0) {
            let (action, out) = lb.program.test_run(&frame, lb.servers_ifindex).unwrap();
            let mut core_out = frame.clone();
            let verdict = worker.process(&mut core_out, now, Ingress::ServerSide);
            let Verdict::ToServer(core_pick) = verdict else {
                panic!("SYN {i}: the core says {verdict:?}");
            };
            assert_eq!(action, XDP_TX, "SYN {i} went up");
            kernel_picks.push(picked(&out, servers));
            core_picks.push(core_pick.0);
            open.retain(|(c, ..)| c.port != client.port);
            open.push((client, isn, core_pick.0));
        }
    }
    assert!(closes > 400, "{closes} closes");
    assert!(
        kernel_picks == core_picks,
        "least-loaded over {servers}, active connections: the kernel's picks differ from the core's, {}",
        first_difference(&kernel_picks, &core_picks)
    );

    // Published packet rates, a new set every 40 SYNs: each publication must reach the
    // cache (the core's policy reads the same view).
    let config = config_with("least-loaded", "load_metric = \"packets\"", servers, &[]);
    let lb = set_up(&config);
    pin_to_this_cpu();
    let pool = lb.kernel_plane.shared().snapshot.load().vips[0]
        .pool
        .clone();
    let mut policy = LeastLoaded::new(lb.worker_config.index);
    let mut rng = PolicyRng::seed_from_u64(lb.worker_config.seed);
    let (mut kernel_picks, mut core_picks) = (Vec::new(), Vec::new());
    for round in 0..6u16 {
        let mut view = LoadView::new();
        for id in 1..=servers {
            let rate = f64::from((id * 5 + round * 3) % 7) * 1000.5;
            view.set_load(ServerId(id), LoadMetric::Packets, rate);
        }
        publish(&lb.program, &view, servers);
        let first = u32::from(round) * 40;
        kernel_picks.extend(kernel_picks_of(&lb, servers, first..first + 40));
        for _ in 0..40 {
            core_picks.push(core_pick(&mut policy, &pool, &view, &mut rng).0);
        }
    }
    assert!(
        kernel_picks == core_picks,
        "least-loaded over {servers}, packet rates: the kernel's picks differ from the core's, {}",
        first_difference(&kernel_picks, &core_picks)
    );
}
