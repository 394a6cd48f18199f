//! The in-kernel fast path (bpf/xdp_lb.c) held to the core, byte for byte, on every vector
//! of `testdata/vectors` (docs/test-vectors.md). Needs root: it loads the XDP program and
//! makes a network namespace of its own.
//!
//! For each suite: the program is loaded, its maps are published from the core's tables by
//! the daemon's publisher (`dataplane::xdp_tables`), and the core's clock table is built
//! over the program's mmapped `msb_seen`/`msb_restores` arrays, so the kernel and the core
//! see one clock state, as in `cheetah run`. Each vector then runs as the core's own test
//! runs it (crates/core/tests/vectors.rs: a fresh pipeline, `msb_state` imported, prelude
//! first), every packet going first through the kernel (`BPF_PROG_TEST_RUN`) and then
//! through the core, as a packet meets them in `cheetah run`. Per packet:
//!
//! * the kernel handled it (a `STAT_FAST_*` counter moved): its verdict and bytes must be
//!   the core's after the AF_XDP worker's egress step. Toward a server: `XDP_TX` (the
//!   server's interface is the one the packet came in on), destination MAC the server's,
//!   source MAC the interface's. Toward the client: `XDP_REDIRECT`, MACs of the FIB's
//!   answer (the client gateway's and the client interface's). `BPF_PROG_TEST_RUN` does not
//!   perform the redirect, so its target ifindex is not observable here; the source MAC,
//!   which the program copies from the same FIB answer, names the interface. The server
//!   the kernel counted traffic for (`server_traffic`) must be the core's;
//! * it went up (anything else: a `STAT_UP_*` reason, or plain steering): its bytes must be
//!   unchanged (the metadata the program puts in front is not part of the frame).
//!
//! A reply that went up because the kernel did not know its server's clock yet
//! (`STAT_UP_CLOCK`) is sent once more after the core learnt it, as the next segment of
//! that connection would be: the kernel must then handle it.
//!
//! Every suite runs twice: with the program's `next_hops` map empty (every reply's next hop
//! from `bpf_fib_lookup`) and mirrored from the namespace's routes and neighbours by the
//! daemon's `NextHopMirror`; the bytes must be the core's either way, and each reply the
//! kernel handles must have taken its next hop from where the run says.
//!
//! The test cannot pass by handing everything up: in each cheetah and hash suite the
//! established client vectors and the replies listed in `MUST_BE_HANDLED_IN_KERNEL` must
//! have been handled by the kernel.
//!
//! The namespace is the test thread's own (`unshare`), so it and its interfaces go away
//! with the thread whatever happens; the publisher is given the routes and neighbours of
//! `/proc/thread-self/net`, since `/proc/net` is the process's first thread's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cheetah_core::config::{LbConfig, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Bundle, Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::tables::ControlPlane;
use cheetah_core::types::{parse_mac, Mac, ServerId};
use cheetah_core::verdict::Verdict;
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::next_hops::NextHopMirror;
use cheetah_daemon::dataplane::xdp::{SteeringProgram, TableWords};
use cheetah_daemon::dataplane::xdp_layout::*;
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};
use libbpf_rs::ProgramInput;
use serde::Deserialize;

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
#[path = "shared/lb_namespace.rs"]
mod lb_namespace;
use lb_namespace::{enter_lb_namespace, interface, Veth};

// --- The vector files (the subset of crates/core/tests/vectors.rs's format read here) ----

#[derive(Deserialize)]
struct VectorFile {
    #[serde(default)]
    removed_servers: Vec<u16>,
    vector: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    name: String,
    now_ns: u64,
    #[serde(default)]
    msb_state: Vec<MsbEntry>,
    #[serde(default)]
    prelude: Vec<PreludePacket>,
    packet_in: String,
    verdict: String,
    packet_out: String,
}

#[derive(Deserialize)]
struct MsbEntry {
    server: u16,
    msb: u16,
}

#[derive(Deserialize)]
struct PreludePacket {
    now_ns: u64,
    packet_in: String,
    verdict: String,
}

/// Per mode, the vectors the kernel must handle itself wherever a suite has them (a reply
/// whose clock was unknown counts when its second sending was handled).
const MUST_BE_HANDLED_IN_KERNEL: &[(Mode, &[&str])] = &[
    (
        Mode::Cheetah,
        &[
            "established-cookie-current-period",
            "established-cookie-previous-period",
            "established-bad-tcp-checksum",
            "client-fin",
            "echo-next-period",
            "echo-1-periods-old",
            "echo-wrap-ahead",
            "echo-wrap-behind",
            "echo-after-reply-advanced",
            "echo-id-9000",
            "no-timestamps-ack-after-syn",
            "server-data",
            "server-data-msb-ffff",
            "server-data-id-9000",
        ],
    ),
    (
        Mode::Hash,
        &[
            "syn-linux",
            "established-ack",
            "established-bad-tcp-checksum",
            "server-syn-ack",
        ],
    ),
];

// --- The namespace ------------------------------------------------------------------------

/// The client gateway's MAC: what the FIB answers for every client address.
const GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x00, 0x01];

#[derive(Clone, Copy, Debug)]
struct Port {
    ifindex: u32,
    mac: Mac,
}

/// The LB's two interfaces in the test's namespace.
struct Topology {
    /// Faces the servers (10.1.0.0/16); every vector arrives here, as the core runs every
    /// vector with `Ingress::ServerSide`.
    servers: Port,
    /// Faces the clients: the default route, through a gateway with a static neighbour entry.
    clients: Port,
}

/// The interfaces' MACs are set when they are made: sysfs (`Interface::discover`) shows the
/// namespace it was mounted in, not this thread's.
const SERVERS: Veth = Veth {
    name: "xp-srv",
    mac: [0x02, 0x1b, 0x00, 0x00, 0x00, 0x05],
    peer: "xp-srv-p",
};
const CLIENTS: Veth = Veth {
    name: "xp-cli",
    mac: [0x02, 0x1b, 0x00, 0x00, 0x00, 0x0c],
    peer: "xp-cli-p",
};

fn port(veth: &Veth) -> Port {
    Port {
        ifindex: interface(veth, 0).ifindex,
        mac: veth.mac,
    }
}

/// Moves this thread, alone, to a new network namespace with `lo` up, IPv4
/// forwarding on `lo` (what `cheetah run` sets for the FIB lookups), and two veth pairs:
/// the servers' subnet behind one, the clients behind a gateway on the other.
fn enter_new_namespace() -> Topology {
    enter_lb_namespace(&SERVERS, &CLIENTS, &GATEWAY_MAC);
    Topology {
        servers: port(&SERVERS),
        clients: port(&CLIENTS),
    }
}

// --- One suite ----------------------------------------------------------------------------

#[derive(Default)]
struct SuiteReport {
    /// Packets the kernel handled, by vector name (a prelude is `name/prelude N`, a second
    /// sending `name (again)`).
    handled: Vec<String>,
    /// Packets that went up, with the reason counter that moved.
    up: Vec<String>,
    /// Frames `BPF_PROG_TEST_RUN` refuses (shorter than an Ethernet header, which no
    /// interface delivers either): the core alone sees them.
    not_runnable: Vec<String>,
    failures: Vec<String>,
}

/// What one packet did in the kernel.
struct KernelRun {
    action: u32,
    /// The frame after the program, without the metadata it may have put in front.
    frame: Vec<u8>,
    /// The `STAT_FAST_*` counters that moved, as `xdp_layout::FAST_BUNDLES` indices.
    fast: Vec<u32>,
    /// The `STAT_UP_*` reasons that moved (`xdp_layout::UP_REASONS`).
    up: Vec<&'static str>,
    /// Steering passed it to the host (not the LB's: ARP, IPv6, ...).
    passed: bool,
    /// Server ids whose `server_traffic` moved.
    traffic: Vec<u16>,
    /// `STAT_NEXT_HOP_MISS` moved: the next hop came from `bpf_fib_lookup`, not the map.
    next_hop_miss: bool,
}

impl KernelRun {
    fn fast_name(&self) -> String {
        self.fast
            .iter()
            .map(|&i| format!("{:?}", FAST_BUNDLES[i as usize].1))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Why it went up, or what steering did with a packet the fast path did not look at
    /// (no socket is bound here, so steering drops what the LB owns).
    fn up_name(&self) -> String {
        match (&self.up[..], self.passed) {
            ([], true) => "passed".into(),
            ([], false) => "steered".into(),
            (up, _) => up.join(","),
        }
    }
}

/// The shortest frame `BPF_PROG_TEST_RUN` takes (`bpf_test_init`).
const ETH_HLEN: usize = 14;
const XDP_ABORTED: u32 = 0;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

fn action_name(action: u32) -> &'static str {
    match action {
        XDP_ABORTED => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "unknown action",
    }
}

fn verdict_name(verdict: Verdict) -> String {
    match verdict {
        Verdict::ToServer(server) => format!("to_server:{}", server.0),
        Verdict::ToClient => "to_client".into(),
        Verdict::ToAllServers { vip } => format!("to_all_servers:{vip}"),
        Verdict::Pass => "pass".into(),
        Verdict::Drop(reason) => format!("drop:{}", reason.name()),
    }
}

struct Suite {
    name: String,
    config: LbConfig,
    secret: Secret,
    file: VectorFile,
}

fn load_suite(dir: &Path) -> Suite {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let config = LbConfig::from_toml(&read(&dir.join("config.toml")))
        .unwrap_or_else(|e| panic!("{name}/config.toml: {e}"));
    let secret = Secret::from_hex(&read(&dir.join("secret.hex")))
        .unwrap_or_else(|| panic!("{name}/secret.hex: not 32 hex digits"));
    let file: VectorFile = toml::from_str(&read(&dir.join("vectors.toml")))
        .unwrap_or_else(|e| panic!("{name}/vectors.toml: {e}"));
    Suite {
        name,
        config,
        secret,
        file,
    }
}

/// The frame the AF_XDP worker would send for the core's verdict: the core leaves the
/// Ethernet addresses to the worker's egress step (`worker_loop.rs`).
fn after_egress(
    topology: &Topology,
    config: &LbConfig,
    verdict: Verdict,
    core_out: &[u8],
) -> Option<(u32, Vec<u8>)> {
    let mut frame = core_out.to_vec();
    let (action, dst, src) = match verdict {
        Verdict::ToServer(id) => {
            let server = config.servers.iter().find(|s| s.id == id.0)?;
            (
                XDP_TX,
                parse_mac(server.mac.as_deref()?)?,
                topology.servers.mac,
            )
        }
        Verdict::ToClient => (XDP_REDIRECT, GATEWAY_MAC, topology.clients.mac),
        _ => return None,
    };
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    Some((action, frame))
}

/// Checks one packet's kernel run against the core's, and files it as handled or up.
#[allow(clippy::too_many_arguments)]
fn judge(
    report: &mut SuiteReport,
    next_hops: NextHops,
    topology: &Topology,
    config: &LbConfig,
    what: &str,
    packet_in: &[u8],
    kernel: &KernelRun,
    verdict: Verdict,
    core_out: &[u8],
    core_counts: &Counts,
) {
    let mut fail = |message: String| report.failures.push(format!("{what}: {message}"));
    if kernel.fast.len() + kernel.up.len() > 1 {
        fail(format!(
            "more than one fast-path counter moved: {} {}",
            kernel.fast_name(),
            kernel.up.join(",")
        ));
        return;
    }
    if kernel.fast.is_empty() {
        if kernel.frame != packet_in {
            fail(format!(
                "went up ({}, {}) with its bytes changed:\n   in  {}\n   out {}",
                kernel.up_name(),
                action_name(kernel.action),
                hex(packet_in),
                hex(&kernel.frame)
            ));
        } else if !matches!(kernel.action, XDP_DROP | XDP_PASS) {
            fail(format!(
                "went up ({}) but returned {} (no socket is bound: XDP_DROP or XDP_PASS)",
                kernel.up_name(),
                action_name(kernel.action)
            ));
        }
        report.up.push(format!("{what} ({})", kernel.up_name()));
        return;
    }
    let Some((action, expected)) = after_egress(topology, config, verdict, core_out) else {
        fail(format!(
            "handled by the kernel ({}, {}), but the core says {}",
            kernel.fast_name(),
            action_name(kernel.action),
            verdict_name(verdict)
        ));
        return;
    };
    let (stat, bundle) = FAST_BUNDLES[kernel.fast[0] as usize];
    let direction_ok = match verdict {
        Verdict::ToServer(_) => [
            STAT_FAST_CLIENT_COOKIE,
            STAT_FAST_CLIENT_PICK,
            STAT_FAST_CLIENT_FALLBACK,
        ]
        .contains(&stat),
        _ => stat == STAT_FAST_SERVER_COOKIE || stat == STAT_FAST_SERVER_PLAIN,
    };
    if !direction_ok {
        fail(format!(
            "counted as {} for the core's {}",
            kernel.fast_name(),
            verdict_name(verdict)
        ));
    }
    // Every client of the vectors is behind the namespace's default route, whose gateway
    // is resolved: the map answers, or, empty, leaves it to the FIB.
    let toward_client = stat == STAT_FAST_SERVER_COOKIE || stat == STAT_FAST_SERVER_PLAIN;
    if toward_client && kernel.next_hop_miss != (next_hops == NextHops::Empty) {
        fail(format!(
            "next_hops {next_hops:?}, but the reply's next hop {} the map",
            if kernel.next_hop_miss {
                "missed"
            } else {
                "came from"
            }
        ));
    }
    if kernel.action != action || kernel.frame != expected {
        fail(format!(
            "kernel {} differs from the core's {} ({} expected):\n   kernel {}\n   core   {}",
            action_name(kernel.action),
            verdict_name(verdict),
            action_name(action),
            hex(&kernel.frame),
            hex(&expected)
        ));
    }
    let server = match verdict {
        Verdict::ToServer(id) => Some(id.0),
        _ => None,
    };
    // The core counted exactly what the kernel's one counter stands for.
    let expected_counts = counts_of_bundle(bundle);
    if *core_counts != expected_counts {
        fail(format!(
            "counted as {} ({expected_counts:?}), but the core counted {core_counts:?}",
            kernel.fast_name()
        ));
    }
    if kernel.traffic.len() != 1 || server.is_some_and(|id| kernel.traffic != [id]) {
        fail(format!(
            "server_traffic moved for servers {:?}; the core's verdict is {}",
            kernel.traffic,
            verdict_name(verdict)
        ));
    }
    report.handled.push(what.to_string());
}

/// Whether the program's `next_hops` map is filled for a run of the suites: results must
/// not depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NextHops {
    /// Every reply's next hop from `bpf_fib_lookup`.
    Empty,
    /// Mirrored from the namespace's routes and neighbours, as `cheetah run` does.
    Mirrored,
}

fn run_suite(topology: &Topology, suite: &Suite, next_hops: NextHops) -> SuiteReport {
    let mut report = SuiteReport::default();
    let program = Kernel::load(topology, next_hops, suite.config.fallback_table_capacity);
    for vector in &suite.file.vector {
        // The kernel's `now` about the vector's (a few ms later): the same time unit of the
        // fallback table for all but a vector that sits at a unit's end.
        let clock_base_ns = monotonic_ns() - vector.now_ns;
        let (plane, mut worker) = program.fresh_pipeline(suite, vector, clock_base_ns);
        let mut packets: Vec<(String, u64, &str, &str)> = vector
            .prelude
            .iter()
            .enumerate()
            .map(|(n, p)| {
                (
                    format!("{}/{}/prelude {n}", suite.name, vector.name),
                    p.now_ns,
                    p.packet_in.as_str(),
                    p.verdict.as_str(),
                )
            })
            .collect();
        packets.push((
            format!("{}/{}", suite.name, vector.name),
            vector.now_ns,
            vector.packet_in.as_str(),
            vector.verdict.as_str(),
        ));
        let main = packets.len() - 1;
        for (n, (what, now, packet_in, expected_verdict)) in packets.iter().enumerate() {
            let packet_in = unhex(packet_in);
            let send = |report: &mut SuiteReport, worker: &mut Worker, what: &str| {
                // Kernel first, then the core: the order a packet meets them.
                let kernel =
                    (packet_in.len() >= ETH_HLEN).then(|| program.run(topology, &packet_in));
                let mut core_out = packet_in.clone();
                let before = counts(worker);
                let verdict = worker.process(&mut core_out, *now, Ingress::ServerSide);
                let core_counts = counted_since(worker, &before);
                match &kernel {
                    Some(kernel) => judge(
                        report,
                        next_hops,
                        topology,
                        &suite.config,
                        what,
                        &packet_in,
                        kernel,
                        verdict,
                        &core_out,
                        &core_counts,
                    ),
                    None => report.not_runnable.push(what.to_string()),
                }
                (kernel, verdict, core_out)
            };
            let (kernel, verdict, core_out) = send(&mut report, &mut worker, what);
            // The core is the reference only while it still gives the files' answer.
            if verdict_name(verdict) != *expected_verdict
                || (n == main && hex(&core_out) != vector.packet_out)
            {
                report.failures.push(format!(
                    "{what}: the core no longer gives the vector's output ({} instead of {}); regenerate the vectors first",
                    verdict_name(verdict),
                    expected_verdict
                ));
            }
            if kernel.is_some_and(|k| k.up == [CLOCK]) {
                send(&mut report, &mut worker, &format!("{what} (again)"));
            }
        }
        drop(worker);
        drop(plane);
    }
    report
}

/// The vectors of `MUST_BE_HANDLED_IN_KERNEL` this suite has that the kernel did not handle.
fn not_handled(suite: &Suite, report: &SuiteReport) -> Option<(Vec<String>, Vec<String>)> {
    let (_, required) = MUST_BE_HANDLED_IN_KERNEL
        .iter()
        .find(|(mode, _)| *mode == suite.config.mode)?;
    let present: Vec<String> = required
        .iter()
        .filter(|name| suite.file.vector.iter().any(|v| v.name == **name))
        .map(|name| format!("{}/{name}", suite.name))
        .collect();
    let missing = present
        .iter()
        .filter(|name| {
            !report
                .handled
                .iter()
                .any(|h| h == *name || *h == format!("{name} (again)"))
        })
        .cloned()
        .collect();
    Some((present, missing))
}

#[test]
fn every_vector_gives_the_cores_bytes_in_the_kernel_or_goes_up_unchanged() {
    if !is_root() {
        eprintln!(
            "\n*** SKIPPED xdp_parity: needs root (loads the XDP program, makes a network namespace); run it with sudo ***\n"
        );
        return;
    }
    let topology = enter_new_namespace();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .expect("testdata/vectors")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("vectors.toml").exists())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no suite under testdata/vectors");
    let mut failures = Vec::new();
    let mut unhandled = Vec::new();
    let mut summary = String::new();
    for (dir, next_hops) in dirs
        .iter()
        .flat_map(|dir| [NextHops::Empty, NextHops::Mirrored].map(|n| (dir, n)))
    {
        let mut suite = load_suite(dir);
        suite.name = format!("{} [next_hops {next_hops:?}]", suite.name);
        let report = run_suite(&topology, &suite, next_hops);
        let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
        for up in &report.up {
            let reason = up
                .rsplit_once(" (")
                .map_or("", |(_, r)| r.trim_end_matches(')'));
            *by_reason.entry(reason.to_string()).or_default() += 1;
        }
        let _ = writeln!(
            summary,
            "{:<20} {:>3} packets handled in the kernel, {:>3} went up {:?}{}",
            suite.name,
            report.handled.len(),
            report.up.len(),
            by_reason,
            if report.not_runnable.is_empty() {
                String::new()
            } else {
                format!(", not runnable: {}", report.not_runnable.join(", "))
            }
        );
        failures.extend(report.failures.iter().cloned());
        if let Some((present, missing)) = not_handled(&suite, &report) {
            if present.is_empty() {
                let _ = writeln!(
                    summary,
                    "{:<20} (no established or reply vector to require)",
                    ""
                );
            }
            unhandled.extend(missing);
        }
    }
    eprintln!("{summary}");
    assert!(
        failures.is_empty(),
        "{} packet(s) where the kernel and the core disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        unhandled.is_empty(),
        "the kernel handed up established or reply vectors it must handle itself: {}",
        unhandled.join(", ")
    );
    eprintln!(
        "xdp_parity: every vector of {} suites agrees with the core",
        dirs.len()
    );
}

// --- The kernel side --------------------------------------------------------------------

/// The loaded program (not attached: `BPF_PROG_TEST_RUN` needs no attachment) and its
/// clock and fallback words, shared with every pipeline made for the suite's vectors.
struct Kernel {
    program: SteeringProgram,
    words: TableWords,
}

impl Kernel {
    fn load(topology: &Topology, next_hops: NextHops, fallback_capacity: usize) -> Self {
        let program =
            SteeringProgram::load(fallback_capacity).expect("the verifier refused bpf/xdp_lb.c");
        if next_hops == NextHops::Mirrored {
            // In this thread, so from this thread's namespace.
            let entries = NextHopMirror::new()
                .and_then(|mut mirror| mirror.refresh(&program))
                .expect("mirror the namespace's next hops");
            assert!(entries > 0, "nothing to mirror in the test's namespace");
        }
        // As `cheetah run` does at start: every interface gets a slot (so steering writes
        // its metadata), and the host's own addresses are known.
        program
            .set_interface_slot(topology.servers.ifindex, 0)
            .unwrap();
        program
            .set_interface_slot(topology.clients.ifindex, 1)
            .unwrap();
        program
            .set_host_addrs(&[Ipv4Addr::new(10, 1, 255, 254), Ipv4Addr::new(10, 7, 0, 1)])
            .unwrap();
        let words = program
            .table_words()
            .expect("mmap the clock and fallback words");
        Kernel { program, words }
    }

    /// A fresh core pipeline for `vector`, as crates/core/tests/vectors.rs makes it, over
    /// the kernel's clock and fallback words (which `MsbTable::with_words` and
    /// `FallbackTable::with_words` clear), and the kernel's maps published from its tables,
    /// the kernel's clock at 0 at CLOCK_MONOTONIC `clock_base_ns`.
    fn fresh_pipeline(
        &self,
        suite: &Suite,
        vector: &Vector,
        clock_base_ns: u64,
    ) -> (ControlPlane, Worker) {
        let words = self.words;
        let mut plane =
            ControlPlane::new_with_tables(&suite.config, &suite.secret, &|layout, _| {
                words.tables(layout)
            })
            .expect("suite config is valid");
        for id in &suite.file.removed_servers {
            plane.remove_server(*id, 0).expect("removable server");
        }
        let msb: Vec<_> = vector
            .msb_state
            .iter()
            .map(|e| (ServerId(e.server), u32::from(e.msb) << 16))
            .collect();
        plane.shared().msb.import(&msb, 0);
        self.publish(&plane, clock_base_ns);
        let worker = Worker::new(
            Arc::clone(plane.shared()),
            WorkerConfig::new(0, 1, &suite.config),
        );
        (plane, worker)
    }

    /// Publishes `plane`'s tables into the kernel's maps, as `cheetah run` does.
    fn publish(&self, plane: &ControlPlane, clock_base_ns: u64) {
        let snapshot = plane.shared().snapshot.load();
        let interfaces = [interface(&SERVERS, 0), interface(&CLIENTS, 1)];
        let publication = Publication {
            snapshot: &snapshot,
            layout: plane.shared().layout(),
            interfaces: &interfaces,
            sides: &[Ingress::ServerSide, Ingress::ClientSide],
            fast_path: true,
            fallback_sets: plane.shared().fallback.sets(),
            clock_base_ns,
        };
        // This thread's namespace's tables: /proc/net is the process's first thread's.
        let routes = read(Path::new("/proc/thread-self/net/route"));
        let neighbours = read(Path::new("/proc/thread-self/net/arp"));
        Publisher::new()
            .write(&self.program, wanted(&publication, &routes, &neighbours))
            .expect("publish the tables");
    }

    /// One packet through the program as received on the servers' interface.
    // `ProgramInput` is non-exhaustive: no struct literal outside libbpf-rs.
    #[allow(clippy::field_reassign_with_default)]
    fn run(&self, topology: &Topology, packet: &[u8]) -> KernelRun {
        let stats_before = self.program.stats();
        let ids: Vec<ServerId> = (0..ServerId::SPACE as u32)
            .map(|id| ServerId(id as u16))
            .collect();
        let traffic_before = self.program.server_traffic(&ids).unwrap();
        let mut context = [0u8; 24];
        // struct xdp_md: data 0, data_end, data_meta 0, ingress_ifindex, rx_queue_index 0,
        // egress_ifindex 0.
        context[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
        context[12..16].copy_from_slice(&topology.servers.ifindex.to_ne_bytes());
        let mut context_out = [0u8; 24];
        let mut data_out = vec![0u8; packet.len() + 256];
        let mut input = ProgramInput::default();
        input.data_in = Some(packet);
        input.data_out = Some(&mut data_out);
        input.context_in = Some(&mut context);
        input.context_out = Some(&mut context_out);
        input.repeat = 1;
        let output = self
            .program
            .object()
            .progs_mut()
            .find(|p| p.name() == "cheetah_lb")
            .expect("program cheetah_lb")
            .test_run(input)
            .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN on {} bytes: {e}", packet.len()));
        let action = output.return_value;
        let data = output.data.expect("data out").to_vec();
        // The context out says where the frame starts after the metadata steering put in
        // front of it (`data` is the metadata's length).
        let meta = u32::from_ne_bytes(context_out[0..4].try_into().unwrap()) as usize;
        let frame = data[meta.min(data.len())..].to_vec();
        let stats_after = self.program.stats();
        let fast = (0..FAST_BUNDLES.len() as u32)
            .filter(|&i| stats_after.fast[i as usize] != stats_before.fast[i as usize])
            .collect();
        let up = UP_REASONS
            .iter()
            .enumerate()
            .filter(|(i, _)| stats_after.up[*i] != stats_before.up[*i])
            .map(|(_, (_, reason))| *reason)
            .collect();
        let traffic_after = self.program.server_traffic(&ids).unwrap();
        let traffic = ids
            .iter()
            .zip(traffic_before.iter().zip(&traffic_after))
            .filter(|(_, (before, after))| before != after)
            .map(|(id, _)| id.0)
            .collect();
        KernelRun {
            action,
            frame,
            fast,
            up,
            passed: stats_after.passed_to_host != stats_before.passed_to_host,
            traffic,
            next_hop_miss: stats_after.next_hop_miss != stats_before.next_hop_miss,
        }
    }
}

/// `UP_REASONS`' label of `STAT_UP_CLOCK`: the one reason a second sending can change.
const CLOCK: &str = "clock";

// --- Helpers ------------------------------------------------------------------------------

/// Every core counter's value (drops apart), in `Counter::ALL` order.
type Counts = Vec<(Counter, u64)>;

/// The worker's bookkeeping that depends on when a packet comes, not on what it is.
const HOUSEKEEPING: [Counter; 2] = [Counter::LoadMerges, Counter::SnapshotReloads];

fn counts(worker: &Worker) -> Counts {
    Counter::ALL
        .iter()
        .filter(|c| !HOUSEKEEPING.contains(c))
        .map(|&c| (c, worker.counters().get(c)))
        .collect()
}

/// The counters that moved since `before`, by how much.
fn counted_since(worker: &Worker, before: &Counts) -> Counts {
    counts(worker)
        .into_iter()
        .zip(before)
        .filter(|((_, now), (_, then))| now != then)
        .map(|((c, now), (_, then))| (c, now - then))
        .collect()
}

/// What one packet of `bundle` counts, in `Counter::ALL` order.
fn counts_of_bundle(bundle: Bundle) -> Counts {
    Counter::ALL
        .iter()
        .filter(|c| bundle.counters().contains(c))
        .map(|&c| (c, 1))
        .collect()
}

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/vectors")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// --- The fallback table, one for the kernel and the core ----------------------------------

/// The fallback table's time unit (2^30 ns, core lb/fallback.rs).
const UNIT_SHIFT: u32 = 30;

/// A client without timestamps, in l2-cheetah's vectors: its SYN (placed by Maglev through
/// the core, which remembers it in the table over the kernel's words), then its ACK and a
/// RST without ACK, both of the same flow, must be forwarded by the kernel from that table
/// with the bytes and counters the core gives them, and the kernel's refresh of the flow's
/// time must be the word the core writes. A flow the table does not know, and a flow
/// whose server was removed, go up unchanged.
#[test]
fn the_kernel_routes_clients_without_timestamps_by_the_cores_fallback_table() {
    if !is_root() {
        eprintln!("\n*** SKIPPED xdp_parity: needs root ***\n");
        return;
    }
    let topology = enter_new_namespace();
    let suite = load_suite(&vectors_dir().join("l2-cheetah"));
    let vector = |name: &str| {
        suite
            .file
            .vector
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("l2-cheetah has no vector {name}"))
    };
    let after_syn = vector("no-timestamps-ack-after-syn");
    let syn = unhex(&after_syn.prelude[0].packet_in);
    let ack = unhex(&after_syn.packet_in);
    let rst = unhex(&vector("client-rst-without-timestamps").packet_in);
    assert_eq!(ack[26..38], rst[26..38], "the ACK and the RST are one flow");
    // The SYN five units before the segments; the kernel's clock mid-unit, so that a run
    // of the test stays in one unit.
    let unit = 1000u64;
    let syn_at = (unit - 5) << UNIT_SHIFT;
    let now = (unit << UNIT_SHIFT) + (1 << (UNIT_SHIFT - 1));
    let kernel = Kernel::load(
        &topology,
        NextHops::Empty,
        suite.config.fallback_table_capacity,
    );
    let clock_base_ns = monotonic_ns() - now;
    let (mut plane, mut worker) = kernel.fresh_pipeline(&suite, after_syn, clock_base_ns);
    // The reference: the same packets through a core alone, at the same times.
    let reference_plane = ControlPlane::new(&suite.config, &suite.secret).unwrap();
    let mut reference = Worker::new(
        Arc::clone(reference_plane.shared()),
        WorkerConfig::new(0, 1, &suite.config),
    );
    let fallback_index = FAST_BUNDLES
        .iter()
        .position(|(stat, _)| *stat == STAT_FAST_CLIENT_FALLBACK)
        .unwrap() as u32;

    // The SYN: a new connection, placed by the core, which remembers it.
    let up = kernel.run(&topology, &syn);
    assert_eq!((up.fast.len(), &up.up[..]), (0, &["new_connection"][..]));
    assert_eq!(up.frame, syn, "a SYN goes up unchanged");
    let placed = worker.process(&mut syn.clone(), syn_at, Ingress::ServerSide);
    assert_eq!(
        reference.process(&mut syn.clone(), syn_at, Ingress::ServerSide),
        placed
    );
    let table = &plane.shared().fallback;
    assert_eq!(table.len(), 1, "the core's SYN is in the kernel's words");
    assert_eq!(table.export(now)[0].idle_units, 5);

    // Its ACK and its RST: forwarded by the kernel from the core's entry.
    for (what, segment) in [("ACK", &ack), ("RST without ACK", &rst)] {
        let run = kernel.run(&topology, segment);
        let mut core_out = segment.clone();
        let before = counts(&reference);
        let verdict = reference.process(&mut core_out, now, Ingress::ServerSide);
        let core_counts = counted_since(&reference, &before);
        assert_eq!(verdict, placed, "{what}: the core routes it by the table");
        assert_eq!(
            (&run.fast[..], &run.up[..]),
            (&[fallback_index][..], &[][..] as &[&str]),
            "{what}: handled in the kernel as a fallback hit"
        );
        let (action, expected) =
            after_egress(&topology, &suite.config, verdict, &core_out).unwrap();
        assert_eq!(run.action, action, "{what}");
        assert_eq!(hex(&run.frame), hex(&expected), "{what}: the core's bytes");
        assert_eq!(
            core_counts,
            counts_of_bundle(Bundle::ClientFallback),
            "{what}: the bundle is what the core counts"
        );
        let Verdict::ToServer(server) = verdict else {
            unreachable!()
        };
        assert_eq!(run.traffic, [server.0], "{what}: the server's traffic");
        // The kernel refreshed the flow's time as the core's lookup did (the same word:
        // the same flows with the same idle times, at any instant).
        assert_eq!(
            table.export(now),
            reference_plane.shared().fallback.export(now),
            "{what}: the kernel's refresh is the core's"
        );
        assert_eq!(table.export(now)[0].idle_units, 0, "{what}: refreshed");
    }

    // Another client port: not in the table. Up unchanged; the core asks Maglev.
    let mut stranger = ack.clone();
    stranger[34..36].copy_from_slice(&0x9c41u16.to_be_bytes());
    let run = kernel.run(&topology, &stranger);
    assert_eq!((run.fast.len(), &run.up[..]), (0, &["fallback_miss"][..]));
    assert_eq!(run.frame, stranger, "a miss goes up unchanged");
    let before = counts(&worker);
    let verdict = worker.process(&mut stranger.clone(), now, Ingress::ServerSide);
    assert!(matches!(verdict, Verdict::ToServer(_)), "{verdict:?}");
    assert!(counted_since(&worker, &before).contains(&(Counter::FallbackMisses, 1)));

    // Its server removed: the core drops the segment and forgets the flow; the kernel
    // leaves both to it.
    let Verdict::ToServer(server) = placed else {
        panic!("the SYN was placed: {placed:?}")
    };
    plane.remove_server(server.0, now).unwrap();
    kernel.publish(&plane, clock_base_ns);
    worker.tick(now);
    let run = kernel.run(&topology, &ack);
    assert_eq!((run.fast.len(), &run.up[..]), (0, &["cookie"][..]));
    assert_eq!(run.frame, ack, "goes up unchanged");
    let verdict = worker.process(&mut ack.clone(), now, Ingress::ServerSide);
    assert_eq!(verdict_name(verdict), "drop:fallback_server_removed");
    assert!(plane.shared().fallback.is_empty());
}
