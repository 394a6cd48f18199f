//! The differential fuzz runner of issue 22: frames (those of `testdata/vectors` and of the
//! cargo-fuzz corpus, plus seeded mutations) go through the XDP program
//! (`BPF_PROG_TEST_RUN`) and through the core, over one clock table, and the kernel must
//! never do anything but what the core does. Needs root (loads the program, makes a network
//! namespace); runs on stable, so CI runs it (libFuzzer needs nightly). docs/fuzzing.md
//! has the documented run.
//!
//! Settings: every suite of `testdata/vectors` (its config, secret and removed servers),
//! each with the program's `next_hops` map empty and mirrored, in turn, `BLOCK` inputs
//! each, on a fresh core pipeline whose tables the daemon's publisher writes into the
//! program's maps. Time moves forward between inputs (µs to a minute), the clock table is
//! refreshed every LB second as the daemon does, and now and then a vector's clock state is
//! imported, so cookies restore and replies' clocks are known.
//!
//! Each input runs through the kernel, then through the core (`Worker::process`, the
//! ingress side the input came in on), and is judged by exactly one rule:
//!
//! * **handled in the kernel** (a `STAT_FAST_*` counter moved): exactly one such counter
//!   and no `STAT_UP_*` or steering counter moved; the core's verdict is `ToServer` or
//!   `ToClient`, and its bytes after the AF_XDP worker's egress step (egress.rs), with
//!   `XDP_TX` out of the interface the frame came in on and `XDP_REDIRECT` out of the
//!   other, are the kernel's action and bytes; the core's counters for that packet are
//!   exactly the ones the `STAT_FAST_*` entry stands for (`FAST_BUNDLES`, `FAST_EVENTS`,
//!   `Bundle::counters`: each +1, every other counter, drop reason and restore beyond the
//!   idle limit 0; snapshot reloads and load merges are the worker's housekeeping, not the
//!   packet's; the clock table's count of writes is a shared word, below);
//!   `server_traffic` moved for exactly the core's server
//!   (the verdict's, or the reply's sender: its MAC in l2, its address in NAT) by one packet
//!   and the IP total length; and the words kernel and core share (shared_words.rs) changed
//!   exactly as the core changes them, the core being run on the words as they were before
//!   the kernel ran, i.e. as if the packet had gone up instead. So the kernel never
//!   handles a packet the core would drop, pass, copy or count differently.
//! * **dropped in the kernel** (a `STAT_DROP_*` counter moved, `xdp_layout::KERNEL_DROPS`):
//!   `XDP_DROP`, the frame unchanged, and the core drops it for that very reason, counting
//!   that reason and exactly what the entry stands for (`dropped`, and a reply's
//!   `fast_path`); no `server_traffic` or shared word moved.
//! * **handed up** (no `STAT_FAST_*` moved): the frame is unchanged, the action `XDP_DROP`
//!   or `XDP_PASS` (no AF_XDP socket is bound), exactly one `STAT_UP_*` reason moved or,
//!   for a packet the fast path did not look at, none and a steering counter did, no
//!   `server_traffic` moved and no shared word changed. The core may then say anything: it
//!   decides, as it does in `cheetah run`.
//!
//! At the end of each block, every server id's `server_traffic` (not only the configured
//! ones read per packet) must have moved by exactly what the handled packets added.
//!
//! The rule does not depend on which packets the kernel handles, so the runner keeps
//! working as more moves into the kernel; the share it handled is printed.
//!
//! `CHEETAH_XDP_FUZZ_INPUTS` (default `CI_INPUTS`) and `CHEETAH_XDP_FUZZ_SEED` (a number, or
//! `random` for one from the clock; default `DEFAULT_SEED`) choose the run. A failure names
//! the seed and the input's index: the same two variables replay it (the run is a pure
//! function of the seed, the index counts from its start).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Instant;

use cheetah_core::config::{Forwarding, LbConfig};
use cheetah_core::lb::{Counter, Ingress, Worker};
use cheetah_core::tables::ControlPlane;
use cheetah_core::types::{parse_mac, ServerId, NANOS_PER_SEC};
use cheetah_core::verdict::{DropReason, Verdict};
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::xdp_layout::ICMP_FORWARDS;
use rand_core::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
#[path = "shared/lb_namespace.rs"]
mod lb_namespace;
#[path = "shared/lb_topology.rs"]
mod lb_topology;
use lb_topology::{enter_new_namespace, Topology};
#[path = "shared/vectors.rs"]
mod vectors;
use vectors::{hex, load_suite, repository_path, suite_dirs, unhex, verdict_name, Suite};
#[path = "shared/xdp_kernel.rs"]
mod xdp_kernel;
use xdp_kernel::{
    action_name, ip_total_len, l3_offset, to_the_host, Kernel, KernelRun, NextHops, XDP_DROP,
    XDP_PASS,
};
#[path = "shared/egress.rs"]
mod egress;
use egress::after_egress;
#[path = "shared/shared_words.rs"]
mod shared_words;
use shared_words::SharedWords;
#[path = "shared/frame_mutator.rs"]
mod frame_mutator;
use frame_mutator::{Dictionary, Mutator};
// The corpus's input format, read where the fuzz target and its stable replay read it.
#[allow(dead_code)]
#[path = "../../../fuzz/harness/input.rs"]
mod fuzz_input;

/// Inputs of a run without `CHEETAH_XDP_FUZZ_INPUTS`: what CI runs.
const CI_INPUTS: u64 = 100_000;
const DEFAULT_SEED: u64 = 0x5eed_c4ee_7a40_0022;
/// Inputs per setting before the next one: a fresh pipeline and a full publish cost about
/// as much as a few hundred inputs.
const BLOCK: u64 = 1_000;

// --- The frames mutations start from --------------------------------------------------------

struct Frame {
    bytes: Vec<u8>,
    ingress: Ingress,
    origin: String,
    /// The clocks its vector starts from (empty for corpus frames).
    clock: Vec<(ServerId, u32)>,
}

/// Every frame of every vector (prelude packets too; each arrives on the servers' side, as
/// the vectors run), by suite.
fn vector_frames(suite: &Suite) -> Vec<Frame> {
    let mut frames = Vec::new();
    for vector in &suite.file.vector {
        let prelude = vector.prelude.iter().enumerate().map(|(n, p)| {
            (
                format!("{}/{}/prelude {n}", suite.name, vector.name),
                &p.packet_in,
            )
        });
        for (origin, text) in
            prelude.chain([(format!("{}/{}", suite.name, vector.name), &vector.packet_in)])
        {
            frames.push(Frame {
                bytes: unhex(text),
                ingress: Ingress::ServerSide,
                origin,
                clock: vector.msb_import(),
            });
        }
    }
    frames
}

/// Every packet record of the cargo-fuzz corpus and regression inputs (docs/fuzzing.md's
/// input format), with the side it came in on.
fn corpus_frames() -> Vec<Frame> {
    let mut frames = Vec::new();
    for dir in ["fuzz/corpus/pipeline", "fuzz/regressions/pipeline"] {
        let mut files: Vec<_> = std::fs::read_dir(repository_path(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for file in files {
            let input = std::fs::read(&file).unwrap();
            let Some(records) = input.get(2..) else {
                continue;
            };
            let (records, _) = fuzz_input::parse(records);
            for (n, record) in records.into_iter().enumerate() {
                if let fuzz_input::Record::Packet { ingress, bytes, .. } = record {
                    frames.push(Frame {
                        bytes: bytes.to_vec(),
                        ingress,
                        origin: format!(
                            "{dir}/{} record {n}",
                            file.file_name().unwrap().to_string_lossy()
                        ),
                        clock: Vec::new(),
                    });
                }
            }
        }
    }
    frames
}

/// What field-aware mutations draw from for `config`: its VIPs, servers and ports, the
/// LB host's addresses and interface MACs, the gateway's, and the broadcast MAC.
fn dictionary(config: &LbConfig, topology: &Topology) -> Dictionary {
    let mut d = Dictionary::default();
    for vip in &config.vips {
        if let IpAddr::V4(addr) = vip.address {
            d.addrs.push(addr.octets());
        }
        d.ports.push(vip.port);
        d.ports.extend(vip.backend_port);
    }
    for server in &config.servers {
        if let IpAddr::V4(dip) = server.dip {
            d.addrs.push(dip.octets());
        }
        d.macs.extend(server.mac.as_deref().and_then(parse_mac));
    }
    d.addrs.extend([
        [10, 1, 255, 254],
        [10, 7, 0, 1],
        [10, 7, 0, 2],
        [198, 51, 100, 7],
    ]);
    d.ports.extend([40000, 0, 65535]);
    d.macs.extend([
        topology.servers.mac,
        topology.clients.mac,
        lb_topology::GATEWAY_MAC,
        [0xff; 6],
    ]);
    d
}

// --- The core's counters for one packet --------------------------------------------------

/// Every count the core keeps that one packet can move: the worker's counters, its drops
/// by reason, and the clock table's restores beyond the idle limit. (Its count of writes
/// is a shared word, `msb_clock.writes`, which the kernel bumps as the core does: compared
/// with the words.)
fn core_counts(worker: &Worker, plane: &ControlPlane) -> Vec<u64> {
    let counters = worker.counters();
    let msb = &plane.shared().msb;
    Counter::ALL
        .iter()
        .map(|c| counters.get(*c))
        .chain(DropReason::ALL.iter().map(|r| counters.drops(*r)))
        .chain([msb.echoes_beyond_idle_limit()])
        .collect()
}

fn count_name(index: usize) -> String {
    let counters = Counter::ALL.len();
    let drops = DropReason::ALL.len();
    match index {
        i if i < counters => Counter::ALL[i].name().to_string(),
        i if i < counters + drops => format!("drop:{}", DropReason::ALL[i - counters].name()),
        _ => "echoes_beyond_idle_limit".into(),
    }
}

/// The worker's housekeeping, which `process` may do on any packet.
fn housekeeping(index: usize) -> bool {
    matches!(
        Counter::ALL.get(index),
        Some(Counter::SnapshotReloads | Counter::LoadMerges)
    )
}

/// The counts moved, as `name +n`.
fn moved(before: &[u64], after: &[u64]) -> Vec<String> {
    before
        .iter()
        .zip(after)
        .enumerate()
        .filter(|(i, (b, a))| b != a && !housekeeping(*i))
        .map(|(i, (b, a))| format!("{} +{}", count_name(i), a.wrapping_sub(*b)))
        .collect()
}

// --- One input ---------------------------------------------------------------------------

struct Core {
    verdict: Verdict,
    frame: Vec<u8>,
    moved: Vec<String>,
    /// Handled in the kernel: how the shared words the core left differ from the kernel's.
    words_differ: Vec<String>,
}

/// What the runner files an input under.
enum Outcome {
    Handled(String),
    Up(String),
}

/// The server the core counts a packet's traffic for: the verdict's, or a reply's sender
/// (its MAC with l2, its address with NAT, as the core recognises a reply).
fn traffic_server(config: &LbConfig, verdict: Verdict, input: &[u8]) -> Option<u16> {
    match verdict {
        Verdict::ToServer(id) => Some(id.0),
        Verdict::ToClient => config
            .servers
            .iter()
            .find(|s| match config.forwarding {
                Forwarding::L2 => s
                    .mac
                    .as_deref()
                    .and_then(parse_mac)
                    .is_some_and(|mac| input.get(6..12) == Some(&mac[..])),
                Forwarding::Nat => {
                    let src = l3_offset(input) + 12;
                    matches!(s.dip, IpAddr::V4(dip) if input.get(src..src + 4) == Some(&dip.octets()[..]))
                }
            })
            .map(|s| s.id),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn judge(
    topology: &Topology,
    config: &LbConfig,
    ingress: Ingress,
    input: &[u8],
    kernel: &KernelRun,
    kernel_wrote: &[String],
    core: &Core,
) -> Result<Outcome, String> {
    // Counted beside a forwarded packet's entry only (then the handled case's counters
    // compare it with the core's).
    if kernel.echo_beyond_idle_limit && (!kernel.handled() || kernel.dropped_for().is_some()) {
        return Err("counted an echo beyond the idle limit, but did not forward it".into());
    }
    if !kernel.handled() {
        if kernel.frame != input {
            return Err("went up with its bytes changed".into());
        }
        if !matches!(kernel.action, XDP_DROP | XDP_PASS) {
            return Err(format!(
                "went up but returned {} (no socket is bound: XDP_DROP or XDP_PASS)",
                action_name(kernel.action)
            ));
        }
        if kernel.up.len() > 1 || (kernel.up.is_empty() && kernel.steered.is_empty()) {
            return Err(format!(
                "went up with reasons {:?} and steering counters {:?}: one reason, or steering alone",
                kernel.up, kernel.steered
            ));
        }
        if !kernel.traffic.is_empty() {
            return Err(format!(
                "went up but server_traffic moved: {:?}",
                kernel.traffic
            ));
        }
        if !kernel_wrote.is_empty() {
            return Err(format!(
                "went up but changed shared words: {kernel_wrote:?}"
            ));
        }
        // The host's stack gets it: what the core forwards must reach a worker, but for a
        // segment to the host itself, which steering gives the host whatever its source
        // (the answer to a health probe: the core, which knows no host address, would
        // take it for a reply).
        if kernel.action == XDP_PASS {
            if matches!(
                core.verdict,
                Verdict::ToServer(_) | Verdict::ToClient | Verdict::ToAllServers { .. }
            ) && !to_the_host(input)
            {
                return Err(format!(
                    "passed to the host, but the core says {}",
                    verdict_name(core.verdict)
                ));
            }
            if core.verdict == Verdict::Pass {
                if core.moved != ["passed +1"] {
                    return Err(format!(
                        "passed to the host as the core does, but the core counted {:?}",
                        core.moved
                    ));
                }
                return Ok(Outcome::Handled("pass".into()));
            }
            // A packet steering owned (a NAT backend's) that the kernel judged not a
            // reply: passed only where the core passes it.
            if kernel.reply_by_steering {
                return Err(format!(
                    "passed a backend's segment to the host, but the core says {}",
                    verdict_name(core.verdict)
                ));
            }
        }
        let reason = match kernel.up.first() {
            Some(reason) => format!("up:{reason}"),
            None => format!("steering:{}", kernel.steered.join("+")),
        };
        return Ok(Outcome::Up(reason));
    }
    if kernel.fast_moved() != 1 || !kernel.up.is_empty() || !kernel.steered.is_empty() {
        return Err(format!(
            "handled ({}) with other counters moving too: up {:?}, steering {:?}",
            kernel.fast_name(),
            kernel.up,
            kernel.steered
        ));
    }
    // Dropped in the kernel: the core drops it for the same reason and counts nothing else.
    if let Some(reason) = kernel.dropped_for() {
        if core.verdict != Verdict::Drop(reason) || kernel.action != XDP_DROP {
            return Err(format!(
                "the kernel {} for {}, the core says {}",
                action_name(kernel.action),
                reason.name(),
                verdict_name(core.verdict)
            ));
        }
        if kernel.frame != input {
            return Err("dropped with its bytes changed".into());
        }
        same_counters(
            &kernel.counted(),
            Some(format!("drop:{} +1", reason.name())),
            &core.moved,
            "drop",
        )?;
        if !kernel.traffic.is_empty() || !kernel_wrote.is_empty() {
            return Err(format!(
                "dropped, but server_traffic moved ({:?}) or shared words changed ({kernel_wrote:?})",
                kernel.traffic
            ));
        }
        return Ok(Outcome::Handled(format!("drop:{}", reason.name())));
    }
    let Some((action, expected)) = after_egress(
        topology,
        config,
        topology.port(ingress),
        core.verdict,
        &core.frame,
    ) else {
        return Err(format!(
            "handled by the kernel ({}), but the core says {}",
            kernel.fast_name(),
            verdict_name(core.verdict)
        ));
    };
    if kernel.action != action || kernel.frame != expected {
        return Err(format!(
            "the kernel's {} differs from the core's {} ({} after the egress step)",
            action_name(kernel.action),
            verdict_name(core.verdict),
            action_name(action)
        ));
    }
    let stat = kernel.fast_stat();
    let name = kernel.fast_name();
    let late = kernel
        .echo_beyond_idle_limit
        .then(|| "echoes_beyond_idle_limit +1".to_string());
    same_counters(&kernel.counted(), late, &core.moved, &name)?;
    let total_len = ip_total_len(input);
    let traffic: Vec<(u16, u64, u64)> = kernel
        .traffic
        .iter()
        .filter(|t| t.packets != 0 || t.bytes != 0)
        .map(|t| (t.server, t.packets, t.bytes))
        .collect();
    let server = traffic_server(config, core.verdict, input);
    // An ICMP error counts toward no server's load in the core.
    let icmp = ICMP_FORWARDS.contains(&stat);
    let traffic_expected = match server {
        Some(_) if icmp => Some(Vec::new()),
        Some(id) => Some(vec![(id, 1, total_len)]),
        None => None,
    };
    if traffic_expected != Some(traffic.clone()) {
        return Err(format!(
            "server_traffic moved {traffic:?} (server, packets, bytes); the core counts one packet of {total_len} bytes for server {server:?}"
        ));
    }
    // The load counts the kernel moved: a SYN's pick is opened on the core's server; a
    // retransmitted SYN releases one count, its earlier pick's (which one is the handshake
    // table's word, compared below with the core's).
    let syn = kernel.opened_a_connection();
    let opened: Vec<(u16, u64)> = kernel
        .traffic
        .iter()
        .filter(|t| t.opened != 0)
        .map(|t| (t.server, t.opened))
        .collect();
    let opened_expected = match (syn, server) {
        (true, Some(id)) => vec![(id, 1)],
        _ => Vec::new(),
    };
    let released: u64 = kernel.traffic.iter().map(|t| t.closed).sum();
    // A first close of a server's: one count down, on the server. A SYN-ACK's move: one
    // down on the server that held the count (the handshake word's, compared below), one
    // up on the server that answered.
    let moved = kernel.moved_a_count();
    let released_expected = u64::from(kernel.released_a_syn())
        + u64::from(kernel.counted().contains(&Counter::ServerCloses))
        + u64::from(moved);
    let moved_in: Vec<(u16, u64)> = kernel
        .traffic
        .iter()
        .filter(|t| t.moved_in != 0)
        .map(|t| (t.server, t.moved_in))
        .collect();
    let moved_in_expected = match (moved, server) {
        (true, Some(id)) => vec![(id, 1)],
        _ => Vec::new(),
    };
    if opened != opened_expected || released != released_expected || moved_in != moved_in_expected {
        return Err(format!(
            "load counts: opened {opened:?}, released {released}, moved in {moved_in:?}; the core's {name} opens {opened_expected:?}, releases {released_expected} and moves in {moved_in_expected:?}"
        ));
    }
    if !core.words_differ.is_empty() {
        return Err(format!(
            "shared words: the kernel left them otherwise than the core: {:?}",
            core.words_differ
        ));
    }
    Ok(Outcome::Handled(name))
}

// --- The run -----------------------------------------------------------------------------

/// Whether the core's counters that moved (`core_moved`, one "name +1" each) are those the
/// kernel's entry `what` stands for (`counted`, plus `extra`), in any order.
fn same_counters(
    counted: &[Counter],
    extra: Option<String>,
    core_moved: &[String],
    what: &str,
) -> Result<(), String> {
    let mut stands_for: Vec<String> = counted
        .iter()
        .map(|c| format!("{} +1", c.name()))
        .chain(extra)
        .collect();
    let mut core_moved = core_moved.to_vec();
    stands_for.sort();
    core_moved.sort();
    if core_moved != stands_for {
        return Err(format!(
            "counters: the kernel's {what} stands for {stands_for:?}, the core counted {core_moved:?}"
        ));
    }
    Ok(())
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn seed() -> u64 {
    match env_value("CHEETAH_XDP_FUZZ_SEED").as_deref() {
        None => DEFAULT_SEED,
        Some("random") => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
        Some(text) => {
            let text = text.trim_start_matches("0x");
            u64::from_str_radix(text, 16)
                .unwrap_or_else(|_| panic!("CHEETAH_XDP_FUZZ_SEED={text}: not a hex number"))
        }
    }
}

struct Tally {
    handled: BTreeMap<String, u64>,
    up: BTreeMap<String, u64>,
    by_setting: BTreeMap<String, (u64, u64)>,
    /// Disagreements excused because the kernel's clock may have crossed a time unit's
    /// boundary past the core's `now` before the program read it ([`crossed_a_unit`]).
    clock_slips: u64,
}

/// The shared tables' time units, each with how far below its boundaries `now` is never
/// drawn: handshake retry marks and fallback ages (2^30 ns; 10 ms), the clock table's
/// anchors (ms; 100 us).
const TIME_UNITS: [(u64, u64); 2] = [(1 << 30, 10_000_000), (1_000_000, 100_000)];

/// `now`, moved up to a unit's boundary where it is closer below one than the unit's
/// margin ([`TIME_UNITS`]).
fn clear_of_unit_boundaries(mut now: u64) -> u64 {
    for (unit, margin) in TIME_UNITS {
        if unit - now % unit < margin {
            now += unit - now % unit;
        }
    }
    now
}

/// Whether a clock read up to `slack` ns after `now` may fall in another unit than `now`
/// (the kernel's clock is `now` when a run starts and runs on: preempted between, it
/// writes a later ms than the core, which is no difference between the two).
fn crossed_a_unit(now: u64, slack: u64) -> bool {
    TIME_UNITS
        .iter()
        .any(|(unit, _)| now % unit + slack >= *unit)
}

#[test]
fn the_kernel_does_what_the_core_does_or_hands_the_frame_up_unchanged() {
    if !is_root() {
        eprintln!(
            "\n*** SKIPPED xdp_differential: needs root (loads the XDP program, makes a network namespace); run it with sudo ***\n"
        );
        return;
    }
    let seed = seed();
    let inputs: u64 = env_value("CHEETAH_XDP_FUZZ_INPUTS").map_or(CI_INPUTS, |v| {
        v.replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("CHEETAH_XDP_FUZZ_INPUTS={v}: not a count"))
    });
    eprintln!("xdp_differential: CHEETAH_XDP_FUZZ_SEED={seed:x} CHEETAH_XDP_FUZZ_INPUTS={inputs}");
    let topology = enter_new_namespace();
    let suites: Vec<Suite> = suite_dirs().iter().map(|d| load_suite(d)).collect();
    let by_suite: Vec<Vec<Frame>> = suites.iter().map(vector_frames).collect();
    let corpus = corpus_frames();
    let everything: Vec<&Frame> = by_suite
        .iter()
        .flatten()
        .chain(&corpus)
        .filter(|f| f.bytes.len() >= xdp_kernel::ETH_HLEN)
        .collect();
    let splice_sources: Vec<Vec<u8>> = everything.iter().map(|f| f.bytes.clone()).collect();
    eprintln!(
        "xdp_differential: {} vector frames of {} suites, {} corpus frames; {} of at least an Ethernet header",
        by_suite.iter().map(Vec::len).sum::<usize>(),
        suites.len(),
        corpus.len(),
        everything.len()
    );
    // One program for every suite: its fallback table sized for the largest of theirs.
    let fallback_capacity = suites
        .iter()
        .map(|s| s.config.fallback_table_capacity)
        .max()
        .expect("suites");
    let mut kernels = [NextHops::Empty, NextHops::Mirrored].map(|n| {
        let kernel = Kernel::load(&topology, n, fallback_capacity);
        let words = SharedWords::of(&kernel.program);
        eprintln!(
            "xdp_differential: next_hops {n:?}: shared words compared: {}",
            words.names().join(", ")
        );
        (n, kernel, words)
    });
    let every_id: Vec<ServerId> = (0..ServerId::SPACE as u32)
        .map(|id| ServerId(id as u16))
        .collect();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut tally = Tally {
        handled: BTreeMap::new(),
        up: BTreeMap::new(),
        by_setting: BTreeMap::new(),
        clock_slips: 0,
    };
    let started = Instant::now();
    let mut index = 0u64;
    let mut block = 0u64;
    let mut failure = None;
    'blocks: while index < inputs {
        let setting = block as usize % (suites.len() * kernels.len());
        block += 1;
        let suite_index = setting / kernels.len();
        let suite = &suites[suite_index];
        let (next_hops, kernel, words) = &mut kernels[setting % 2];
        let setting_name = format!("{} [next_hops {next_hops:?}]", suite.name);
        let (plane, mut worker) = kernel.pipeline(
            &topology,
            &suite.config,
            &suite.secret,
            &suite.file.removed_servers,
            &[],
            // The fallback path's clock starts at the block's first `now`; its refreshes
            // are not compared (the fallback map is no one-entry array).
            monotonic_ns() - 10 * NANOS_PER_SEC,
        );
        let ids: Vec<ServerId> = suite
            .config
            .servers
            .iter()
            .map(|s| ServerId(s.id))
            .collect();
        let traffic_start = kernel.program.server_traffic(&every_id).unwrap();
        let mut traffic_added: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
        let clocks: Vec<Vec<(ServerId, u32)>> = suite
            .file
            .vector
            .iter()
            .map(|v| v.msb_import())
            .filter(|m| !m.is_empty())
            .collect();
        let dictionary = dictionary(&suite.config, &topology);
        let mut mutator = Mutator {
            rng: rng.clone(),
            dictionary: &dictionary,
        };
        let mut now = 10 * NANOS_PER_SEC;
        let mut refreshed = now;
        let local: Vec<&Frame> = by_suite[suite_index]
            .iter()
            .filter(|f| f.bytes.len() >= xdp_kernel::ETH_HLEN)
            .collect();
        let block_end = (index + BLOCK).min(inputs);
        while index < block_end {
            // Control-plane time: the daemon refreshes the clock table every second; an
            // import sets a vector's clocks (as a restart restores persisted ones).
            now += match mutator.below(1000) {
                0 => 66 * NANOS_PER_SEC,
                1..=9 => NANOS_PER_SEC,
                10..=199 => 1_000_000,
                _ => 1 + mutator.below(50_000) as u64,
            };
            // The kernel's clock is the core's `now` when the run is set up, and a few
            // microseconds more when the program reads it: close below a boundary of the
            // shared tables' time units, the two would write different units. Not a
            // difference between kernel and core.
            now = clear_of_unit_boundaries(now);
            if now - refreshed >= NANOS_PER_SEC {
                plane.shared().msb.refresh(now);
                refreshed = now;
            }
            let base = if !local.is_empty() && !mutator.chance(4) {
                local[mutator.below(local.len())]
            } else {
                everything[mutator.below(everything.len())]
            };
            // Mostly the clocks the frame's own vector starts from, so that its cookie
            // restores and its reply's clock is known; sometimes another vector's.
            if !base.clock.is_empty() && mutator.chance(2) {
                plane.shared().msb.import(&base.clock, now);
            } else if !clocks.is_empty() && (index.is_multiple_of(BLOCK) || mutator.chance(64)) {
                let clock = &clocks[mutator.below(clocks.len())];
                plane.shared().msb.import(clock, now);
            }
            words.settle();
            let mut input = base.bytes.clone();
            let mut ingress = base.ingress;
            let mut mutations = Vec::new();
            if mutator.chance(16) {
                ingress = match ingress {
                    Ingress::ServerSide => Ingress::ClientSide,
                    Ingress::ClientSide => Ingress::ServerSide,
                };
                mutations.push("ingress");
            }
            if !mutator.chance(6) {
                mutations.extend(mutator.mutate(&mut input, &splice_sources));
            }

            let kernel_run = kernel.run(topology.port(ingress), &input, &ids, now);
            let kernel_wrote = words.changed();
            let handled = kernel_run.handled();
            let before = core_counts(&worker, &plane);
            let mut frame = input.clone();
            let (verdict, words_differ) = if handled && !kernel_wrote.is_empty() {
                // The core decides from the words the kernel decided from.
                let kernel_words = words.copy();
                words.restore_settled();
                let verdict = worker.process(&mut frame, now, ingress);
                (verdict, words.core_differences(&kernel_words))
            } else {
                let verdict = worker.process(&mut frame, now, ingress);
                (
                    verdict,
                    if handled {
                        words.core_changed()
                    } else {
                        Vec::new()
                    },
                )
            };
            let core = Core {
                verdict,
                frame,
                moved: moved(&before, &core_counts(&worker, &plane)),
                words_differ,
            };
            match judge(
                &topology,
                &suite.config,
                ingress,
                &input,
                &kernel_run,
                &kernel_wrote,
                &core,
            ) {
                Ok(outcome) => {
                    let placed = core.moved.iter().any(|m| m.starts_with("new_connections"))
                        || kernel_run
                            .traffic
                            .iter()
                            .any(|t| t.opened != 0 || t.closed != 0 || t.moved_in != 0);
                    if placed {
                        worker = kernel.reset_policies(&suite.config, &plane);
                    }
                    let entry = tally.by_setting.entry(setting_name.clone()).or_default();
                    entry.0 += 1;
                    match outcome {
                        Outcome::Handled(name) => {
                            entry.1 += 1;
                            *tally.handled.entry(name).or_default() += 1;
                            for moved in &kernel_run.traffic {
                                let sum = traffic_added.entry(moved.server).or_default();
                                sum.0 += moved.packets;
                                sum.1 += moved.bytes;
                            }
                        }
                        Outcome::Up(reason) => *tally.up.entry(reason).or_default() += 1,
                    }
                }
                Err(_) if crossed_a_unit(now, kernel_run.clock_slack_ns) => {
                    tally.clock_slips += 1;
                }
                Err(problem) => {
                    let egress = after_egress(
                        &topology,
                        &suite.config,
                        topology.port(ingress),
                        core.verdict,
                        &core.frame,
                    );
                    let mut report = String::new();
                    let _ = writeln!(
                        report,
                        "input {index} (CHEETAH_XDP_FUZZ_SEED={seed:x} CHEETAH_XDP_FUZZ_INPUTS={}), setting {setting_name}, now {now} ns: {problem}",
                        index + 1
                    );
                    let _ = writeln!(
                        report,
                        "  from {} ({:?}), mutations {:?}, arrived on the {ingress:?}",
                        base.origin, base.ingress, mutations
                    );
                    let _ = writeln!(report, "  input  {}", hex(&input));
                    let _ = writeln!(
                        report,
                        "  kernel {} fast {:?} up {:?} steering {:?} traffic {:?} wrote {:?}\n         {}",
                        action_name(kernel_run.action),
                        kernel_run.fast_name(),
                        kernel_run.up,
                        kernel_run.steered,
                        kernel_run.traffic,
                        kernel_wrote,
                        hex(&kernel_run.frame)
                    );
                    let _ = writeln!(
                        report,
                        "  core   {} counted {:?}\n         {}",
                        verdict_name(core.verdict),
                        core.moved,
                        match &egress {
                            Some((action, bytes)) =>
                                format!("{} {}", action_name(*action), hex(bytes)),
                            None => format!("(sends nothing) {}", hex(&core.frame)),
                        }
                    );
                    failure = Some(report);
                    break 'blocks;
                }
            }
            index += 1;
        }
        // Every id, not only the configured ones read per packet.
        let traffic_end = kernel.program.server_traffic(&every_id).unwrap();
        for ((id, start), end) in every_id.iter().zip(&traffic_start).zip(&traffic_end) {
            let added = traffic_added.get(&id.0).copied().unwrap_or_default();
            let moved = (
                end.packets.wrapping_sub(start.packets),
                end.bytes.wrapping_sub(start.bytes),
            );
            if moved != added {
                failure = Some(format!(
                    "block ending at input {index} (CHEETAH_XDP_FUZZ_SEED={seed:x}), setting {setting_name}: server_traffic of server {} moved by {moved:?} (packets, bytes), the handled packets by {added:?}",
                    id.0
                ));
                break 'blocks;
            }
        }
        rng = mutator.rng;
        drop(worker);
        drop(plane);
    }
    let seconds = started.elapsed().as_secs_f64();
    let handled: u64 = tally.handled.values().sum();
    // Passed to the host's stack where the core passes (not the LB's traffic), apart from
    // what the kernel forwarded or dropped.
    let passed = tally.handled.get("pass").copied().unwrap_or(0);
    let share = |n: u64| 100.0 * n as f64 / index.max(1) as f64;
    let mut summary = String::new();
    let _ = writeln!(
        summary,
        "xdp_differential: {index} inputs in {seconds:.1} s ({:.0} per second), seed {seed:x}; handled in the kernel {handled} ({:.1}%: forwarded or dropped {} ({:.1}%), passed to the host as the core passes {passed} ({:.1}%)): {:?}",
        index as f64 / seconds,
        share(handled),
        handled - passed,
        share(handled - passed),
        share(passed),
        tally.handled
    );
    let _ = writeln!(summary, "  went up, by reason: {:?}", tally.up);
    let _ = writeln!(
        summary,
        "  disagreements excused as the kernel's clock crossing a unit before its read: {}",
        tally.clock_slips
    );
    for (setting, (total, handled)) in &tally.by_setting {
        let _ = writeln!(
            summary,
            "  {setting:<40} {total:>8} inputs, {handled:>7} handled"
        );
    }
    eprint!("{summary}");
    if let Some(report) = failure {
        panic!("the kernel and the core disagree:\n{report}");
    }
    // A slip needs a run preempted for the distance to a unit's boundary (at least
    // 100 us, below): rare, or the excuse would hide real differences.
    assert!(
        tally.clock_slips <= 5 + index / 100_000,
        "{} of {index} disagreements excused as clock slips: too many to be the scheduler's",
        tally.clock_slips
    );
    assert!(
        handled > 0,
        "the kernel handled none of {index} inputs: the runner would compare nothing"
    );
}
