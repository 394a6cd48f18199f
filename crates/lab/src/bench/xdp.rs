//! `cheetah bench --xdp`: what the in-kernel path (bpf/xdp_lb.c's `lb_process`) costs per
//! packet, timed by the kernel itself under `BPF_PROG_TEST_RUN`.
//!
//! `bpf/xdp_bench.c` wraps the LB in `bench_lb`, which first copies a pristine frame from
//! its `bench_frame` map into the packet, and the same copy around a bare `XDP_TX` in
//! `bench_trivial`. Each run is one `BPF_PROG_TEST_RUN` with repeat = 1, whose `duration`
//! the kernel measures around the program alone (`bpf_test_run`: `ktime_get_ns()` before
//! and after `bpf_prog_run_xdp`, so the syscall, the copies of the frame in and out and the
//! context set-up are outside it; one clock read and the dispatcher call are inside, in
//! both programs). Runs alternate lb, trivial, lb, ... so drift and interference hit both
//! alike; each row reports the median and p10/p90 of each program and of the per-pair
//! difference lb - trivial, the LB's own cost.
//!
//! The maps are filled by the daemon's publisher (`dataplane::xdp_tables`) from a core
//! config like `cheetah bench`'s (VIP 10.0.0.100:80, `--servers` servers), in a network
//! namespace of the process's own with the routes and neighbours the LB needs (server
//! replies look up the next hop toward the client with `bpf_fib_lookup`). Every server's
//! clock is known (imported into the core's clock table, which is the program's
//! `msb_seen`/`msb_restores`), and the frames are the core's own output: a server segment
//! the core wrote a cookie into, and the client ACK echoing it. A row counts only if the
//! LB program took the fast path on every run (its `STAT_FAST_*` counter moved by the
//! number of runs); otherwise it is reported void.

use std::net::SocketAddrV4;
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, ensure, Context};
use cheetah_core::config::{Forwarding, LbConfig, Mode};
use cheetah_core::hash::FlowKey;
use cheetah_core::lb::{Ingress, Worker, WorkerConfig};
use cheetah_core::policy::schedule::SCHEDULE_CAP;
use cheetah_core::policy::{LoadMetric, PolicyKind, ReportedLoad, WorkerLoads};
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::types::{Mac, ServerId};
use cheetah_core::verdict::{DropReason, Verdict};
use cheetah_core::wire::tcp::flags;
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::awrr_schedules::AwrrSchedules;
use cheetah_daemon::dataplane::next_hops::NextHopMirror;
use cheetah_daemon::dataplane::xdp::{size_at_load, SteeringProgram};
use cheetah_daemon::dataplane::xdp_layout::{
    Encode, NextHopKey, STAT_DROP_COOKIE_UNKNOWN_SERVER, STAT_DROP_UNSUPPORTED_ICMP_TYPE,
    STAT_FAST_CLIENT_COOKIE, STAT_FAST_CLIENT_FALLBACK, STAT_FAST_CLIENT_PICK,
    STAT_FAST_CLIENT_SYN, STAT_FAST_FALLBACK_MISS, STAT_FAST_FALLBACK_SYN, STAT_FAST_ICMP_COOKIE,
    STAT_FAST_ICMP_FALLBACK, STAT_FAST_SERVER_CLOSE, STAT_FAST_SERVER_COOKIE,
    STAT_FAST_SERVER_COOKIE_ADVANCED, STAT_FAST_SERVER_COOKIE_UNSTABLE,
    STAT_FAST_SERVER_DUPLICATE_CLOSE, STAT_FAST_SERVER_PLAIN, STAT_NEXT_HOP_CACHE_MISS,
    STAT_NEXT_HOP_MISS, STAT_REPLY_BY_STEERING, STAT_UP_CLOCK,
};
use cheetah_daemon::dataplane::xdp_tables::{self, Publication};
use cheetah_daemon::dataplane::Interface;
use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder, ProgramInput};

use super::lab::SECRET;
use super::{affinity, xdp_flows, xdp_katran, xdp_stages};
use crate::crafted::{Addressing, Malformed};

static BENCH_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp_bench.o"));

/// `BENCH_FRAME_MAX` of bpf/xdp_bench.c.
const BENCH_FRAME_MAX: usize = 256;
const XDP_DROP: u32 = 1;
pub(super) const XDP_TX: u32 = 3;
/// The core's `now` when the bench's frames are made (and the kernel's, by its clock base).
const FRAMES_AT: u64 = 10 * cheetah_core::types::NANOS_PER_SEC;
pub(super) const XDP_REDIRECT: u32 = 4;
/// Untimed runs of each program before a row's timed ones.
pub(super) const WARM_UP_RUNS: u32 = 1_000;
/// The targets, ns per packet net of the trivial program.
const ESTABLISHED_TARGET_NS: f64 = 40.0;
const SERVER_TO_CLIENT_TARGET_NS: f64 = 45.0;
const ESTABLISHED_OVER_HASH_TARGET: f64 = 1.2;
const SYN_TARGET_NS: f64 = 120.0;

const CLIENT_PORT: u16 = 40_000;
const CLIENT_TS: u32 = 0x0102_0304;
/// The servers' clocks: every server's MSB is this (imported into the clock table).
pub(super) const SERVER_MSB: u16 = 0x1234;
/// The clock-advanced row: a server clock just before its MSB moves, and the TSval of the
/// segment it sends 32 ticks later.
const CLOCK_BEFORE_ADVANCE: u32 = (SERVER_MSB as u32) << 16 | 0xfff0;
const CLOCK_ADVANCED: u32 = (SERVER_MSB as u32 + 1) << 16 | 0x0010;
const GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x00, 0x01];
const SERVER_INTERFACE: &str = "xb-srv";
const CLIENT_INTERFACE: &str = "xb-cli";

pub struct Options {
    pub runs: u32,
    /// Extra /32 routes in 10.2.0.0/16 (through the clients' gateway): more entries in the
    /// next_hops trie, around the bench's client.
    pub routes: u32,
    /// Katran's own program to time beside cheetah's (xdp_katran.rs).
    pub katran: Option<std::path::PathBuf>,
    /// Only the SYN rows (SYN_SETUPS, LOAD_SYN_SETUPS), without Katran's.
    pub syn_only: bool,
    pub servers: u16,
    pub core: Option<usize>,
    pub realtime: bool,
    pub markdown: bool,
}

/// One interface of the bench's namespace.
#[derive(Clone, Copy)]
pub(super) struct Port {
    pub(super) ifindex: u32,
}

pub(super) struct Ports {
    pub(super) servers: Port,
    pub(super) clients: Port,
}

/// The setups of the SYN rows: cheetah mode, one per policy the kernel runs (and wrr
/// both ways: from its cycle and by the credit scan; `bench_config` gives their weights).
const SYN_SETUPS: [Setup; 8] = [
    Setup {
        label: "rr",
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::RoundRobin,
    },
    Setup {
        label: WRR_CYCLE,
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::WeightedRoundRobin,
    },
    Setup {
        label: WRR_SCAN,
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::WeightedRoundRobin,
    },
    // From the cycle of buckets of uneven loads (`publish_awrr_cycle`).
    Setup {
        label: "awrr",
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::AutoWeightedRoundRobin,
    },
    Setup {
        label: "random",
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::Random,
    },
    Setup {
        label: "hash",
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::Hash,
    },
    // Over each CPU's load view (all 0 here: the first drawn server wins).
    Setup {
        label: "pow2",
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::PowerOfTwo,
    },
    // The VIP's Maglev table at the connection's hash (maglev_tables).
    Setup {
        label: "maglev",
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::Maglev,
    },
];

/// wrr with odd weights 1, 3, 5, ..: for 64 servers a cycle of 64^2 entries, read from the
/// published schedule.
const WRR_CYCLE: &str = "wrr";
/// wrr with one server of weight SCHEDULE_CAP: a cycle over the cap, so the kernel scans
/// the credits as before schedules up to 64 servers, and over that reads the cycle, whose
/// entries past the cap are in `wrr_schedule_chunks` (one more lookup).
const WRR_SCAN: &str = "wrr over the cap (scan; chunks over 64 servers)";

/// `setup`'s config for `servers` servers: the test kit's, with the wrr rows' weights.
fn bench_config(setup: &Setup, servers: u16) -> LbConfig {
    let mut config = testkit::config(setup.mode, setup.forwarding, setup.policy, servers);
    let weight = |id: u16| match setup.label {
        // Odd weights make a cycle of 64^2 entries at 64 servers; over that, weights 1 to 5
        // keep a cycle that fits (about 3n entries: up to 5,461 servers), which the kernel
        // reads.
        WRR_CYCLE if usize::from(servers) <= 64 => Some(2 * u32::from(id) - 1),
        WRR_CYCLE => Some(1 + u32::from(id - 1) % 5),
        WRR_SCAN => Some(if id == 1 { SCHEDULE_CAP as u32 } else { 1 }),
        _ => None,
    };
    for id in 1..=servers {
        if let Some(weight) = weight(id) {
            config.vips[0].weights.insert(id.to_string(), weight);
        }
    }
    config
}

/// Gives awrr's servers uneven loads and publishes the cycle of their buckets, as the
/// daemon's fold does.
fn publish_awrr_cycle(program: &SteeringProgram, plane: &ControlPlane) -> anyhow::Result<()> {
    let shared = plane.shared();
    let snapshot = shared.snapshot.load();
    let ids = snapshot.vips[0].pool.servers.clone();
    for id in &ids {
        let load = ReportedLoad {
            load: Some(f64::from(id.0 % 7) * 0.1),
            active_connections: Some(u64::from(id.0 % 5)),
        };
        shared.loads.report(*id, load).map_err(anyhow::Error::msg)?;
    }
    let mut view = WorkerLoads::new(Arc::clone(&shared.loads));
    view.watch(&ids);
    view.merge(0);
    AwrrSchedules::new().publish(program, &snapshot, view.view())
}

/// The SYN rows of least loaded and of pow2 on a rate: each over its pool's metric, and
/// the bench's pool (`--servers`) or one of the given size. Every CPU's load view is
/// all 0, which costs what any other: every position is read either way.
const LOAD_SYN_SETUPS: [(Setup, LoadMetric, Option<u16>); 4] = [
    (
        Setup {
            label: "least-loaded",
            mode: Mode::Cheetah,
            forwarding: Forwarding::L2,
            policy: PolicyKind::LeastLoaded,
        },
        LoadMetric::ActiveConnections,
        None,
    ),
    (
        Setup {
            label: "least-loaded, 4 servers",
            mode: Mode::Cheetah,
            forwarding: Forwarding::L2,
            policy: PolicyKind::LeastLoaded,
        },
        LoadMetric::ActiveConnections,
        Some(4),
    ),
    // One word a position (the metric's published row) where active connections read
    // two (the base and this CPU's own count, one 16-byte entry of this CPU's row).
    (
        Setup {
            label: "least-loaded packets",
            mode: Mode::Cheetah,
            forwarding: Forwarding::L2,
            policy: PolicyKind::LeastLoaded,
        },
        LoadMetric::Packets,
        None,
    ),
    (
        Setup {
            label: "pow2 packets",
            mode: Mode::Cheetah,
            forwarding: Forwarding::L2,
            policy: PolicyKind::PowerOfTwo,
        },
        LoadMetric::Packets,
        None,
    ),
];

/// An LB configuration the rows of which share one loaded program and its maps.
pub(super) struct Setup {
    label: &'static str,
    mode: Mode,
    forwarding: Forwarding,
    policy: PolicyKind,
}

pub(super) const SETUPS: [Setup; 4] = [
    Setup {
        label: "cheetah",
        mode: Mode::Cheetah,
        forwarding: Forwarding::L2,
        policy: PolicyKind::RoundRobin,
    },
    Setup {
        label: "plain hash",
        mode: Mode::Hash,
        forwarding: Forwarding::L2,
        policy: PolicyKind::Hash,
    },
    Setup {
        label: "cheetah",
        mode: Mode::Cheetah,
        forwarding: Forwarding::Nat,
        policy: PolicyKind::RoundRobin,
    },
    // Every client segment by the VIP's Maglev table (an inner map of maglev_tables).
    Setup {
        label: "maglev",
        mode: Mode::Maglev,
        forwarding: Forwarding::L2,
        policy: PolicyKind::Maglev,
    },
];

/// The IP option a router may set on a segment: Router Alert (RFC 2113), 4 bytes.
const ROUTER_ALERT: [u8; 4] = [0x94, 0x04, 0x00, 0x00];

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    ClientToServer,
    /// Client->server with `vip_slots` empty: the VIP from the `vips` hash map, as for a
    /// VIP whose slot another took.
    ClientVipByHash,
    ServerToClient,
    /// Client->server and server->client behind an 802.1Q tag (a trunk port): the tag
    /// lifted while the LB decides and put back after (bpf/lib/vlan.h).
    TaggedClientToServer,
    TaggedServerToClient,
    /// Client->server and server->client with 4 bytes of IP options (Router Alert): the
    /// options lifted while the LB decides and put back after (bpf/lib/ip_options.h).
    OptionedClientToServer,
    OptionedServerToClient,
    /// Server->client with `reply_senders` empty: the sender found the old way, by
    /// steering's lookups and the sender's maps, as a reply the map does not know.
    ReplyBySteering,
    /// Server->client with `next_hops` empty: the next hop from `bpf_fib_lookup`, as
    /// every reply toward a client the map does not cover.
    NextHopMiss,
    /// Server->client whose next hop is not in this CPU's `next_hop_cache`: a publication
    /// (a flip with nothing written, untimed) before each run voids the cache, so every run
    /// reads the `next_hops` trie and fills its slot, as the first reply toward a client
    /// after a change of the tables does.
    NextHopCacheMiss,
    /// Only the `bpf_fib_lookup` a next-hop miss makes (bench_fib), to say how much of
    /// that path it is.
    FibLookup,
    /// Only the `next_hops` trie lookup a hit makes (bench_next_hop_trie).
    NextHopTrie,
    /// Only the `next_hop_cache` slot read a cache hit makes (bench_next_hop_cache).
    NextHopCache,
    /// The same answer from a HASH map keyed by the /32 address (bench_next_hop_hash):
    /// what the trie costs beside the cheapest alternative.
    NextHopHash,
    /// A client's SYN placed by the VIP's policy, as a new connection every run (its
    /// handshake-table slot is emptied before each run, out of the timed part).
    Syn,
    /// A server's FIN-ACK toward the client: a reply plus the close filter's read (and,
    /// on the first run only, its write). Every later run is a retransmission, a duplicate
    /// close; a first close differs by one store to the slot's line, already read.
    ServerFin,
    /// An ICMP fragmentation-needed error from a router on the clients' side, quoting the
    /// server segment the client got (the cookie in its TSval): to that server.
    Icmp,
    /// A client ACK without TCP options whose flow the fallback table knows (its SYN went
    /// through the core): forwarded by the kernel from the table.
    FallbackHit,
    /// The same for a flow the table does not know: forwarded by the VIP's Maglev table.
    FallbackMiss,
    /// A server segment whose MSB is one past the server's newest (low half 0x0010 after
    /// 0xfff0): the kernel learns the advance (clock_learn.h: the seen word, the anchor,
    /// the estimate and its 2^k restore entries) and forwards it. Every run is an advance:
    /// before each, untimed, every server's clock is imported back to the MSB before, at
    /// the kernel's `now`.
    ClockAdvanced,
    /// A client SYN without timestamps (Windows' options): placed by the VIP's Maglev
    /// table and remembered in the fallback table, a new connection every run (its
    /// fallback entry and handshake-table slot are emptied before each run, out of the
    /// timed part).
    FallbackSyn,
    /// A client ACK whose cookie names no server, as every packet but 1 in 4096/S of a
    /// forged-cookie flood does: dropped in the kernel as `cookie_unknown_server`.
    ForgedCookieDrop,
    /// A ping of the VIP address: dropped in the kernel as `unsupported_icmp_type`.
    PingDrop,
    /// A server segment whose MSB is two behind the server's (a clock the LB cannot
    /// correct: `tcp_timestamps=1`, or a spoofed reply): forwarded with nothing learnt,
    /// counted `server_ts_clock_unstable`. The first such reply a CPU sees in a second goes
    /// up as a sample (fast_path.h `clock_sample_due`); those runs are counted, not timed.
    ClockUnstable,
    /// An ICMP fragmentation-needed error quoting a server segment to a client without
    /// timestamps (no cookie): to the server the fallback table remembers.
    IcmpFallback,
}

/// Per-run durations of one row, in the kernel's ns.
pub(super) struct Timings {
    lb: Vec<u32>,
    trivial: Vec<u32>,
    /// Runs, warm-up ones included, whose action was not the expected one (the timed
    /// ones are left out of `lb` and `trivial`).
    off_path: u64,
}

impl Timings {
    /// The subject's, the baseline's and their per-run difference's spreads.
    pub(super) fn spreads(&self) -> (Spread, Spread, Spread) {
        let diff = self
            .lb
            .iter()
            .zip(&self.trivial)
            .map(|(l, t)| f64::from(*l) - f64::from(*t))
            .collect();
        (
            spread(self.lb.iter().map(|&v| f64::from(v)).collect()),
            spread(self.trivial.iter().map(|&v| f64::from(v)).collect()),
            spread(diff),
        )
    }
}

/// Runs `subject` and `baseline` alternately on `frame` (after untimed warm-up runs),
/// `before_run` before each pair: their durations, and the first action of `subject` that
/// was not `expected`.
pub(super) fn time_against(
    subject: &libbpf_rs::ProgramMut<'_>,
    baseline: &libbpf_rs::ProgramMut<'_>,
    frame: &[u8],
    ingress: u32,
    runs: u32,
    expected: u32,
    before_run: &dyn Fn() -> anyhow::Result<()>,
) -> anyhow::Result<(Timings, Option<u32>)> {
    let mut timings = Timings {
        lb: Vec::with_capacity(runs as usize),
        trivial: Vec::with_capacity(runs as usize),
        off_path: 0,
    };
    let mut wrong_action = None;
    for n in 0..WARM_UP_RUNS + runs {
        before_run()?;
        let (action, subject_ns) = test_run(subject, frame, ingress)?;
        let (_, baseline_ns) = test_run(baseline, frame, ingress)?;
        if action != expected {
            wrong_action.get_or_insert(action);
            timings.off_path += 1;
        } else if n >= WARM_UP_RUNS {
            timings.lb.push(subject_ns);
            timings.trivial.push(baseline_ns);
        }
    }
    Ok((timings, wrong_action))
}

pub(super) struct Spread {
    pub(super) median: f64,
    pub(super) p10: f64,
    pub(super) p90: f64,
}

pub(super) fn spread(mut values: Vec<f64>) -> Spread {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    Spread {
        median: at(0.5),
        p10: at(0.1),
        p90: at(0.9),
    }
}

struct Row {
    label: String,
    mode: Mode,
    forwarding: Forwarding,
    path: Path,
    frame_len: usize,
    /// None: void, with the reason.
    result: Result<(Spread, Spread, Spread), String>,
}

pub fn run(options: Options) -> anyhow::Result<()> {
    // SAFETY: no arguments, no memory.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "cheetah bench --xdp needs root: it loads XDP programs and makes a network namespace"
    );
    ensure!(options.runs >= 1, "--xdp-runs must be at least 1");
    // Read before entering the namespace: some of net.core's sysctls exist only in the
    // first one.
    let jit = read_setting("/proc/sys/net/core/bpf_jit_enable");
    ensure!(
        options.routes < 65_000,
        "--xdp-routes must be below 65000 (10.2.0.0/16 holds them)"
    );
    let ports = enter_new_namespace(options.routes)?;
    let (pin, rt, placement) = place(options.core, options.realtime);
    let mut rows = Vec::new();
    let mut breakdowns = Vec::new();
    let setups = if options.syn_only {
        &[][..]
    } else {
        &SETUPS[..]
    };
    for (n, setup) in setups.iter().enumerate() {
        let bench = Bench::load(setup, options.servers, 0)?;
        let paths: &[Path] = match (setup.mode, setup.forwarding) {
            (Mode::Cheetah, Forwarding::L2) => &[
                Path::ClientToServer,
                Path::ClientVipByHash,
                Path::ServerToClient,
                Path::TaggedClientToServer,
                Path::TaggedServerToClient,
                Path::OptionedClientToServer,
                Path::OptionedServerToClient,
                Path::ClockAdvanced,
                Path::ReplyBySteering,
                Path::ServerFin,
                Path::Icmp,
                Path::NextHopMiss,
                Path::NextHopCacheMiss,
                Path::FibLookup,
                Path::NextHopTrie,
                Path::NextHopCache,
                Path::NextHopHash,
                Path::FallbackHit,
                Path::FallbackMiss,
                Path::FallbackSyn,
                Path::IcmpFallback,
                Path::ForgedCookieDrop,
                Path::PingDrop,
                Path::ClockUnstable,
            ],
            (Mode::Cheetah, Forwarding::Nat) => &[
                Path::ClientToServer,
                Path::ServerToClient,
                Path::ServerFin,
                Path::Icmp,
            ],
            _ => &[Path::ClientToServer, Path::ServerToClient],
        };
        for &path in paths {
            let row = bench.row(setup, path, &ports, options.runs)?;
            eprintln!("{}", row_line(&row));
            rows.push(row);
        }
        // The first setup (cheetah, l2) is the one the targets are about.
        if n == 0 {
            for direction in [Path::ClientToServer, Path::ServerToClient] {
                breakdowns.push(xdp_stages::breakdown(
                    &bench,
                    direction,
                    &ports,
                    options.runs,
                )?);
            }
        }
    }
    for setup in &SYN_SETUPS {
        let bench = Bench::load(setup, options.servers, 0)?;
        let row = bench.row(setup, Path::Syn, &ports, options.runs)?;
        eprintln!("{}", row_line(&row));
        rows.push(row);
    }
    for (setup, metric, servers) in &LOAD_SYN_SETUPS {
        let mut config = testkit::config(
            setup.mode,
            setup.forwarding,
            setup.policy,
            servers.unwrap_or(options.servers),
        );
        config.vips[0].load_metric = Some(*metric);
        let bench = Bench::load_config(config, 0)?;
        let row = bench.row(setup, Path::Syn, &ports, options.runs)?;
        eprintln!("{}", row_line(&row));
        rows.push(row);
    }
    let katran = match &options.katran {
        Some(object) if !options.syn_only => {
            let bench = Bench::load(&SETUPS[0], options.servers, 0)?;
            Some(xdp_katran::rows(
                object,
                &bench,
                &ports,
                options.runs,
                options.servers,
            )?)
        }
        _ => None,
    };
    if let Some(rt) = rt {
        rt.release();
    }
    if let Some(pin) = pin {
        pin.release();
    }
    println!("{}", machine_note(&placement, &jit));
    println!(
        "runs: {} per program per row (alternating lb, trivial), BPF_PROG_TEST_RUN repeat = 1, after {WARM_UP_RUNS} untimed runs of each; {} extra /32 routes around the client",
        options.runs, options.routes
    );
    print!("{}", render(&rows, options.markdown));
    for breakdown in &breakdowns {
        print!("\n{}", xdp_stages::render(breakdown, options.markdown));
    }
    if let (Some(rows), Some(object)) = (&katran, &options.katran) {
        print!("\n{}", xdp_katran::render(rows, object, options.markdown));
    }
    Ok(())
}

/// Pins the thread to `core` (or the default core) and, if asked, makes it SCHED_FIFO:
/// the guards to release afterwards, and a note of what was obtained.
pub(super) fn place(
    core: Option<usize>,
    realtime: bool,
) -> (Option<affinity::Pinned>, Option<affinity::Realtime>, String) {
    let core = core.unwrap_or_else(affinity::default_core);
    let (pin, mut placement) = match affinity::pin_to(core) {
        Ok(pin) => (Some(pin), format!("pinned to core {core}")),
        Err(e) => (None, format!("NOT pinned ({e})")),
    };
    let rt = if realtime {
        match affinity::realtime() {
            Ok(rt) => {
                placement.push_str(", SCHED_FIFO");
                Some(rt)
            }
            Err(e) => {
                placement.push_str(&format!(", SCHED_FIFO refused ({e})"));
                None
            }
        }
    } else {
        None
    };
    (pin, rt, placement)
}

pub(super) struct Bench {
    pub(super) program: SteeringProgram,
    pub(super) plane: ControlPlane,
    config: LbConfig,
    /// CLOCK_MONOTONIC ns at which the kernel's `now` is 0 (`lb_config.clock_base_ns`).
    pub(super) clock_base_ns: u64,
}

impl Bench {
    /// Loads bpf/xdp_bench.c with its flow maps sized for `flows` flows (xdp_flows.rs; 0
    /// when the bench cycles over no flows) and publishes `setup`'s tables into it.
    pub(super) fn load(setup: &Setup, servers: u16, flows: u32) -> anyhow::Result<Self> {
        Self::load_config(bench_config(setup, servers), flows)
    }

    /// [`Bench::load`] for `config` (one VIP, servers 1..=n, as `testkit::config` makes).
    fn load_config(mut config: LbConfig, flows: u32) -> anyhow::Result<Self> {
        // Room for the flows the fallback curve fills in (xdp_flows.rs).
        config.fallback_table_capacity = config
            .fallback_table_capacity
            .max(xdp_flows::fallback_table_size(flows));
        let mut open = ObjectBuilder::default()
            .open_memory(BENCH_OBJECT)
            .context("cannot open the embedded bpf/xdp_bench.c")?;
        size_at_load(&mut open, config.fallback_table_capacity)?;
        for mut map in open.maps_mut() {
            let entries = match map.name().to_str() {
                Some("bench_flows") => flows.max(1),
                Some("bench_connections") => xdp_flows::connection_table_size(flows),
                _ => continue,
            };
            map.set_max_entries(entries)
                .context("cannot size the bench's flow maps")?;
        }
        let object = open.load().context("the kernel refused bpf/xdp_bench.c")?;
        // What `cheetah run` publishes, for the bench's two interfaces.
        let interfaces = [
            interface(SERVER_INTERFACE, SERVER_INTERFACE_MAC, 0)?,
            interface(CLIENT_INTERFACE, CLIENT_INTERFACE_MAC, 1)?,
        ];
        Self::publish_config(
            SteeringProgram::from_object(object),
            config,
            &interfaces,
            &[Ingress::ServerSide, Ingress::ClientSide],
        )
    }

    /// Fills `program`'s maps as `cheetah run` would for `setup` with `servers` servers on
    /// `interfaces` (beside each its side), every server's clock known, and keeps the
    /// control plane whose clock table is the program's.
    pub(super) fn publish(
        program: SteeringProgram,
        setup: &Setup,
        servers: u16,
        interfaces: &[Interface],
        sides: &[Ingress],
    ) -> anyhow::Result<Self> {
        Self::publish_config(program, bench_config(setup, servers), interfaces, sides)
    }

    /// [`Bench::publish`] for `config`.
    fn publish_config(
        program: SteeringProgram,
        config: LbConfig,
        interfaces: &[Interface],
        sides: &[Ingress],
    ) -> anyhow::Result<Self> {
        let words = program.kernel_words()?;
        let plane =
            ControlPlane::new_with_tables(&config, &SECRET, &|layout, _| words.tables(layout))
                .map_err(anyhow::Error::msg)?;
        let clocks: Vec<(ServerId, u32)> = config
            .servers
            .iter()
            .map(|server| (ServerId(server.id), u32::from(SERVER_MSB) << 16))
            .collect();
        plane.shared().msb.import(&clocks, 0);
        for interface in interfaces {
            program.set_interface_slot(interface.ifindex, interface.slot)?;
        }
        let snapshot = plane.shared().snapshot.load();
        // The kernel's clock at the frames' `now` (FRAMES_AT), so a fallback hit refreshes
        // its entry about once a second as in a live run.
        let clock_base_ns = monotonic_ns() - FRAMES_AT;
        program.set_clock_base(clock_base_ns)?;
        xdp_tables::publish(
            &program,
            &Publication {
                snapshot: &snapshot,
                layout: plane.shared().layout(),
                interfaces,
                sides,
                fast_path: true,
                fallback_sets: plane.shared().fallback.sets(),
            },
        )?;
        if config.vips[0].policy == PolicyKind::AutoWeightedRoundRobin {
            publish_awrr_cycle(&program, &plane)?;
        }
        // As `cheetah run` keeps it: every reply's next hop from the map, unless a row
        // empties it.
        NextHopMirror::new()?.refresh(&program)?;
        Ok(Bench {
            program,
            plane,
            config,
            clock_base_ns,
        })
    }

    /// Every server's clock imported as `tsval` at the core's `now`.
    fn import_clocks(&self, tsval: u32, now: u64) {
        let clocks: Vec<(ServerId, u32)> = self
            .config
            .servers
            .iter()
            .map(|s| (ServerId(s.id), tsval))
            .collect();
        self.plane.shared().msb.import(&clocks, now);
    }

    fn worker(&self) -> Worker {
        Worker::new(
            Arc::clone(self.plane.shared()),
            WorkerConfig::new(0, 1, &self.config),
        )
    }

    /// The row's frame, made and checked by the core: a server segment, the client's ACK
    /// echoing what the core made of it, the server's FIN, or a router's ICMP error quoting
    /// what the client got. Returns the frame and the counter its fast path moves (for a
    /// FIN, the first close's; the duplicates' is [`STAT_FAST_SERVER_DUPLICATE_CLOSE`]).
    pub(super) fn frame(&self, direction: Path) -> anyhow::Result<(Vec<u8>, u32)> {
        self.frame_of_port(direction, CLIENT_PORT)
    }

    /// [`Bench::frame`] for the connection from the client's port `client_port`.
    pub(super) fn frame_of_port(
        &self,
        direction: Path,
        client_port: u16,
    ) -> anyhow::Result<(Vec<u8>, u32)> {
        let mut worker = self.worker();
        let now = FRAMES_AT;
        let (client, _) = frame_client();
        if let Path::FallbackHit | Path::FallbackMiss | Path::IcmpFallback = direction {
            return self.fallback_frame(&mut worker, direction, client, CLIENT_PORT);
        }
        // Which server the client's connection is on: the one the core picks for its SYN.
        let mut syn = TcpFrame::from_client(
            client,
            client_port,
            flags::SYN,
            options::linux_syn(CLIENT_TS, 0),
        )
        .build();
        let Verdict::ToServer(server) = worker.process(&mut syn, now, Ingress::ServerSide) else {
            bail!("the core did not send the bench's SYN to a server");
        };
        let reply_base = self.server_segment(
            server,
            client,
            client_port,
            options::nop_nop_ts(u32::from(SERVER_MSB) << 16 | 0x5678, CLIENT_TS),
        );
        if direction == Path::ClockAdvanced {
            // The core learns the advance in the program's words: from the MSB before,
            // then back to the bench's clocks.
            self.import_clocks(CLOCK_BEFORE_ADVANCE, now);
            let advance = TcpFrame {
                options: options::nop_nop_ts(CLOCK_ADVANCED, CLIENT_TS),
                ..reply_base
            }
            .with_payload(&[0x42; 100])
            .build();
            let verdict = worker.process(&mut advance.clone(), now, Ingress::ServerSide);
            let advanced = self.plane.shared().msb.get(server);
            self.import_clocks(u32::from(SERVER_MSB) << 16, 0);
            ensure!(
                verdict == Verdict::ToClient && advanced == Some(SERVER_MSB + 1),
                "the core's verdict on the bench's advancing segment is {verdict:?}, its estimate {advanced:?}"
            );
            return Ok((advance, STAT_FAST_SERVER_COOKIE_ADVANCED));
        }
        if direction == Path::ClockUnstable {
            let behind = TcpFrame {
                options: options::nop_nop_ts(u32::from(SERVER_MSB - 2) << 16 | 0x5678, CLIENT_TS),
                ..reply_base
            }
            .with_payload(&[0x42; 100])
            .build();
            let verdict = worker.process(&mut behind.clone(), now, Ingress::ServerSide);
            let estimate = self.plane.shared().msb.get(server);
            ensure!(
                verdict == Verdict::ToClient && estimate == Some(SERVER_MSB),
                "the core's verdict on the bench's segment from a clock behind is {verdict:?}, its estimate {estimate:?}"
            );
            return Ok((behind, STAT_FAST_SERVER_COOKIE_UNSTABLE));
        }
        if direction == Path::ServerFin {
            let fin = TcpFrame {
                flags: flags::FIN | flags::ACK,
                ..reply_base
            }
            .build();
            let verdict = worker.process(&mut fin.clone(), now, Ingress::ServerSide);
            ensure!(
                verdict == Verdict::ToClient,
                "the core's verdict on the bench's server FIN is {verdict:?}"
            );
            return Ok((fin, STAT_FAST_SERVER_CLOSE));
        }
        let reply = reply_base.with_payload(&[0x42; 100]).build();
        let mut seen_by_client = reply.clone();
        let verdict = worker.process(&mut seen_by_client, now, Ingress::ServerSide);
        ensure!(
            verdict == Verdict::ToClient,
            "the core's verdict on the bench's server segment is {verdict:?}"
        );
        if direction == Path::ServerToClient {
            return Ok((reply, STAT_FAST_SERVER_COOKIE));
        }
        if direction == Path::Icmp {
            // The quote a Linux router sends: the IP header and the first 52 bytes of TCP
            // (header and options), more than the cookie needs.
            let error = icmp_error_to(&mut worker, &seen_by_client, 20 + 32 + 20, server)?;
            return Ok((error, STAT_FAST_ICMP_COOKIE));
        }
        let (tsval, _) = testkit::timestamps(&seen_by_client).context("no timestamps")?;
        let ack_echoing = |tsecr| {
            TcpFrame::from_client(
                client,
                client_port,
                flags::ACK,
                options::nop_nop_ts(CLIENT_TS + 1, tsecr),
            )
            .build()
        };
        let ack = ack_echoing(tsval);
        let mut routed = ack.clone();
        let verdict = worker.process(&mut routed, now, Ingress::ServerSide);
        ensure!(
            verdict == Verdict::ToServer(server),
            "the core routes the bench's client ACK to {verdict:?}, not to server {}",
            server.0
        );
        match direction {
            Path::ForgedCookieDrop => forged_cookie(&mut worker, &ack_echoing, tsval),
            Path::PingDrop => {
                let to = Addressing {
                    src_mac: ack[6..12].try_into()?,
                    dst_mac: ack[..6].try_into()?,
                    src_ip: client.into(),
                    target: SocketAddrV4::new(testkit::VIP.into(), testkit::VIP_PORT),
                };
                let ping = Malformed::IcmpEchoRequest.frame(&to, 1);
                let verdict = worker.process(&mut ping.clone(), now, Ingress::ServerSide);
                ensure!(
                    verdict == Verdict::Drop(DropReason::UnsupportedIcmpType),
                    "the core's verdict on the bench's ping is {verdict:?}"
                );
                Ok((ping, STAT_DROP_UNSUPPORTED_ICMP_TYPE))
            }
            _ => Ok((ack, STAT_FAST_CLIENT_COOKIE)),
        }
    }

    /// A data-less ACK|PSH from `server` to the client's port with `options`, as the
    /// config's forwarding has the server send it.
    fn server_segment(
        &self,
        server: ServerId,
        client: u32,
        client_port: u16,
        options: Vec<u8>,
    ) -> TcpFrame {
        let flags = flags::ACK | flags::PSH;
        match self.config.forwarding {
            Forwarding::L2 => {
                TcpFrame::from_server_l2(server.0, client, client_port, flags, options)
            }
            Forwarding::Nat => {
                TcpFrame::from_server_nat(server.0, client, client_port, flags, options)
            }
        }
    }

    /// The bench's client SYN (Linux's layout; `without_timestamps`: Windows'), checked to
    /// be placed by the core, and the hash its handshake-table slot (and fallback entry) is
    /// at.
    fn syn_frame(&self, without_timestamps: bool) -> anyhow::Result<(Vec<u8>, u64)> {
        let client = testkit::client_ip(7);
        let options = if without_timestamps {
            options::windows_syn()
        } else {
            options::linux_syn(CLIENT_TS, 0)
        };
        let syn = TcpFrame::from_client(client, CLIENT_PORT, flags::SYN, options).build();
        let mut placed = syn.clone();
        let now = 10 * cheetah_core::types::NANOS_PER_SEC;
        let verdict = self.worker().process(&mut placed, now, Ingress::ServerSide);
        ensure!(
            matches!(verdict, Verdict::ToServer(_)),
            "the core's verdict on the bench's SYN is {verdict:?}"
        );
        let key = FlowKey::tcp(client, CLIENT_PORT, testkit::VIP, testkit::VIP_PORT);
        Ok((syn, self.plane.shared().hasher.hash(&key)))
    }

    /// A client segment without TCP options of a connection whose SYN (without
    /// timestamps) the core placed and remembered in the fallback table over the kernel's
    /// words; for a miss, of another connection, which the table does not know. Returns
    /// the frame and the counter the kernel moves for it.
    pub(super) fn fallback_frame(
        &self,
        worker: &mut Worker,
        direction: Path,
        client: u32,
        client_port: u16,
    ) -> anyhow::Result<(Vec<u8>, u32)> {
        let now = FRAMES_AT;
        let mut syn =
            TcpFrame::from_client(client, client_port, flags::SYN, options::windows_syn()).build();
        let Verdict::ToServer(server) = worker.process(&mut syn, now, Ingress::ServerSide) else {
            bail!("the core did not send the bench's SYN without timestamps to a server");
        };
        let port = match direction {
            Path::FallbackMiss => client_port.wrapping_add(1),
            _ => client_port,
        };
        let ack = TcpFrame::from_client(client, port, flags::ACK, Vec::new())
            .with_payload(&[0x42; 100])
            .build();
        if direction == Path::FallbackMiss {
            return Ok((ack, STAT_FAST_FALLBACK_MISS));
        }
        if direction == Path::IcmpFallback {
            // The server's data segment as the client got it (no options), quoted whole,
            // as a Linux router quotes it.
            let mut seen_by_client = self
                .server_segment(server, client, client_port, Vec::new())
                .with_payload(&[0x42; 100])
                .build();
            let verdict = worker.process(&mut seen_by_client, now, Ingress::ServerSide);
            ensure!(
                verdict == Verdict::ToClient,
                "the core's verdict on the bench's server segment without options is {verdict:?}"
            );
            let error = icmp_error_to(worker, &seen_by_client, 20 + 20 + 8, server)?;
            return Ok((error, STAT_FAST_ICMP_FALLBACK));
        }
        let verdict = worker.process(&mut ack.clone(), now, Ingress::ServerSide);
        ensure!(
            verdict == Verdict::ToServer(server),
            "the core routes the bench's ACK without options to {verdict:?}, not to server {}",
            server.0
        );
        Ok((ack, STAT_FAST_CLIENT_FALLBACK))
    }

    fn row(&self, setup: &Setup, path: Path, ports: &Ports, runs: u32) -> anyhow::Result<Row> {
        let direction = match path {
            Path::ClientToServer
            | Path::ClientVipByHash
            | Path::TaggedClientToServer
            | Path::OptionedClientToServer
            | Path::Syn
            | Path::FallbackSyn => Path::ClientToServer,
            Path::ServerFin
            | Path::Icmp
            | Path::IcmpFallback
            | Path::FallbackHit
            | Path::FallbackMiss
            | Path::ClockAdvanced
            | Path::ForgedCookieDrop
            | Path::PingDrop
            | Path::ClockUnstable => path,
            _ => Path::ServerToClient,
        };
        let (frame, cookie_stat, syn_hash) = if path == Path::Syn {
            let (frame, hash) = self.syn_frame(false)?;
            (frame, STAT_FAST_CLIENT_SYN, Some(hash))
        } else if path == Path::FallbackSyn {
            let (frame, hash) = self.syn_frame(true)?;
            (frame, STAT_FAST_FALLBACK_SYN, Some(hash))
        } else {
            let (frame, stat) = self.frame(direction)?;
            match path {
                Path::TaggedClientToServer | Path::TaggedServerToClient => {
                    (testkit::vlan_tagged(&frame), stat, None)
                }
                Path::OptionedClientToServer | Path::OptionedServerToClient => {
                    (testkit::with_ip_options(&frame, &ROUTER_ALERT), stat, None)
                }
                _ => (frame, stat, None),
            }
        };
        let fast_stat = match (setup.mode, cookie_stat) {
            (Mode::Cheetah, stat) => stat,
            (_, STAT_FAST_CLIENT_COOKIE) => STAT_FAST_CLIENT_PICK,
            _ => STAT_FAST_SERVER_PLAIN,
        };
        // An ICMP error comes from the clients' side; the rest from the servers'.
        let ingress = match path {
            Path::Icmp | Path::IcmpFallback => ports.clients.ifindex,
            _ => ports.servers.ifindex,
        };
        let (subject, expected_action) = match path {
            Path::ClientToServer
            | Path::ClientVipByHash
            | Path::TaggedClientToServer
            | Path::OptionedClientToServer
            | Path::Syn
            | Path::FallbackSyn => ("bench_lb", XDP_TX),
            Path::ServerToClient
            | Path::TaggedServerToClient
            | Path::OptionedServerToClient
            | Path::ServerFin
            | Path::ClockAdvanced
            | Path::ClockUnstable
                if ports.clients.ifindex == ingress =>
            {
                ("bench_lb", XDP_TX)
            }
            Path::ServerToClient
            | Path::TaggedServerToClient
            | Path::OptionedServerToClient
            | Path::ServerFin
            | Path::ClockAdvanced
            | Path::ClockUnstable => ("bench_lb", XDP_REDIRECT),
            Path::Icmp | Path::IcmpFallback if ports.servers.ifindex == ingress => {
                ("bench_lb", XDP_TX)
            }
            Path::Icmp | Path::IcmpFallback => ("bench_lb", XDP_REDIRECT),
            Path::NextHopMiss | Path::NextHopCacheMiss | Path::ReplyBySteering
                if ports.clients.ifindex == ingress =>
            {
                ("bench_lb", XDP_TX)
            }
            Path::NextHopMiss | Path::NextHopCacheMiss | Path::ReplyBySteering => {
                ("bench_lb", XDP_REDIRECT)
            }
            Path::FibLookup => ("bench_fib", XDP_TX),
            Path::NextHopTrie => ("bench_next_hop_trie", XDP_TX),
            Path::NextHopCache => ("bench_next_hop_cache", XDP_TX),
            Path::NextHopHash => ("bench_next_hop_hash", XDP_TX),
            Path::FallbackHit | Path::FallbackMiss => ("bench_lb", XDP_TX),
            Path::ForgedCookieDrop | Path::PingDrop => ("bench_lb", XDP_DROP),
        };
        let emptied = match path {
            Path::NextHopMiss => {
                clear_next_hops(&self.program)?;
                None
            }
            Path::NextHopHash => {
                self.fill_hop_by_address(&frame)?;
                None
            }
            Path::ReplyBySteering => Some((
                "reply_senders",
                take_entries(&self.program, "reply_senders")?,
            )),
            Path::ClientVipByHash => Some(("vip_slots", take_entries(&self.program, "vip_slots")?)),
            _ => None,
        };
        // A FIN's first run is a first close, every later one a duplicate.
        let fast_stats = match path {
            Path::ServerFin => vec![STAT_FAST_SERVER_CLOSE, STAT_FAST_SERVER_DUPLICATE_CLOSE],
            _ => vec![fast_stat],
        };
        let fast_count = |program: &SteeringProgram| -> anyhow::Result<u64> {
            fast_stats.iter().map(|&s| stat(program.object(), s)).sum()
        };
        let before = fast_count(&self.program)?;
        let up_clock_before = stat(self.program.object(), STAT_UP_CLOCK)?;
        let misses_before = stat(self.program.object(), STAT_NEXT_HOP_MISS)?;
        let cache_misses_before = stat(self.program.object(), STAT_NEXT_HOP_CACHE_MISS)?;
        let by_steering_before = stat(self.program.object(), STAT_REPLY_BY_STEERING)?;
        // A SYN is new every run: the slot the last run booked it in (and the fallback
        // entry it made) is emptied first.
        let (handshakes, fallback) = (
            &self.plane.shared().handshakes,
            &self.plane.shared().fallback,
        );
        let before_run = || {
            if let Some(hash) = syn_hash {
                handshakes.forget(hash);
                fallback.remove(hash);
            }
            if path == Path::ClockAdvanced {
                // The MSB before the frame's, anchored at the kernel's `now` (32 ticks
                // before the frame's TSval: no faster than real time).
                let now = monotonic_ns() - self.clock_base_ns;
                self.import_clocks(CLOCK_BEFORE_ADVANCE, now);
            }
            if path == Path::NextHopCacheMiss {
                // A flip with nothing written (both copies are equal): publish_seq moves
                // on, as at any publication.
                if let Ok(mut window) = self.program.publish_window() {
                    window.before_write();
                    window.flip();
                }
            }
        };
        let started = std::time::Instant::now();
        let timed = self.time(subject, &frame, ingress, runs, expected_action, &before_run);
        if path == Path::ClockAdvanced {
            self.import_clocks(u32::from(SERVER_MSB) << 16, 0);
        }
        if path == Path::NextHopMiss {
            // Back to what the other rows expect (a fresh mirror rewrites every entry).
            NextHopMirror::new()?.refresh(&self.program)?;
        }
        if let Some((name, entries)) = emptied {
            put_entries(&self.program, name, &entries)?;
        }
        let (timings, wrong_action) = timed?;
        let moved = fast_count(&self.program)? - before;
        let up_clock = stat(self.program.object(), STAT_UP_CLOCK)? - up_clock_before;
        let misses = stat(self.program.object(), STAT_NEXT_HOP_MISS)? - misses_before;
        let cache_misses =
            stat(self.program.object(), STAT_NEXT_HOP_CACHE_MISS)? - cache_misses_before;
        let by_steering = stat(self.program.object(), STAT_REPLY_BY_STEERING)? - by_steering_before;
        let label = match path {
            Path::FibLookup => "bpf_fib_lookup alone (server->client frame)".to_string(),
            Path::NextHopTrie => "next_hops trie lookup alone (same frame)".to_string(),
            Path::NextHopCache => "next_hop_cache slot alone (same frame)".to_string(),
            Path::NextHopHash => "/32 HASH lookup alone (comparison)".to_string(),
            Path::Syn => format!("SYN, {} (l2)", setup.label),
            Path::FallbackHit => "fallback hit (client without timestamps, l2)".to_string(),
            Path::FallbackMiss => "fallback miss, by Maglev (no timestamps, l2)".to_string(),
            Path::FallbackSyn => "SYN without timestamps, Maglev + insert (l2)".to_string(),
            Path::IcmpFallback => {
                "ICMP error by the fallback table (no timestamps, l2)".to_string()
            }
            Path::ForgedCookieDrop => {
                "forged cookie, dropped: cookie_unknown_server (l2)".to_string()
            }
            Path::PingDrop => "ping of the VIP, dropped: unsupported_icmp_type (l2)".to_string(),
            _ => format!(
                "{} {} ({}){}",
                match path {
                    Path::ClientToServer
                    | Path::ClientVipByHash
                    | Path::TaggedClientToServer
                    | Path::OptionedClientToServer => "established client->server",
                    Path::ServerFin => "server FIN",
                    Path::ClockAdvanced => "server->client, clock advanced,",
                    Path::ClockUnstable => "server->client, clock unstable (not learnt),",
                    Path::Icmp => "ICMP error by cookie",
                    _ => "server->client",
                },
                setup.label,
                match setup.forwarding {
                    Forwarding::L2 => "l2",
                    Forwarding::Nat => "nat",
                },
                match path {
                    Path::NextHopMiss => ", next-hop miss",
                    Path::NextHopCacheMiss => ", next-hop cache miss",
                    Path::ReplyBySteering => ", sender by steering (reply_senders empty)",
                    Path::ClientVipByHash => ", VIP by hash (vip_slots empty)",
                    Path::TaggedClientToServer | Path::TaggedServerToClient => ", 802.1Q tagged",
                    Path::OptionedClientToServer | Path::OptionedServerToClient => {
                        ", 4 bytes of IP options"
                    }
                    _ => "",
                }
            ),
        };
        let all_runs = u64::from(WARM_UP_RUNS + runs);
        // The lookup-alone programs run no LB: nothing to count.
        let (expected_moves, expected_misses) = match path {
            Path::FibLookup | Path::NextHopTrie | Path::NextHopCache | Path::NextHopHash => (0, 0),
            Path::NextHopMiss => (all_runs, all_runs),
            Path::NextHopCacheMiss => (all_runs, 0),
            Path::ReplyBySteering
            | Path::ClientVipByHash
            | Path::ClientToServer
            | Path::ServerToClient
            | Path::TaggedClientToServer
            | Path::TaggedServerToClient
            | Path::OptionedClientToServer
            | Path::OptionedServerToClient
            | Path::Syn
            | Path::ServerFin
            | Path::Icmp
            | Path::FallbackHit
            | Path::FallbackMiss
            | Path::ClockAdvanced
            | Path::FallbackSyn
            | Path::ForgedCookieDrop
            | Path::PingDrop
            | Path::IcmpFallback => (all_runs, 0),
            // The samples handed up are checked below.
            Path::ClockUnstable => (all_runs - timings.off_path, 0),
        };
        // The samples: each run that went up, counted under `clock`, and no more than one
        // a second on this (pinned) CPU, plus one at the start.
        let samples_allowed = started.elapsed().as_secs() + 2;
        let sampled = path == Path::ClockUnstable
            && wrong_action == Some(XDP_DROP)
            && up_clock == timings.off_path
            && timings.off_path <= samples_allowed;
        let result = if let (Some(action), false) = (wrong_action, sampled) {
            Err(format!(
                "void: {subject} returned {action}, not {expected_action}, in {} runs ({up_clock} handed up as clock samples)",
                timings.off_path
            ))
        } else if moved != expected_moves {
            Err(format!(
                "void: the fast path's counter moved {moved} times in {expected_moves} runs"
            ))
        } else if misses != expected_misses {
            Err(format!(
                "void: STAT_NEXT_HOP_MISS moved {misses} times, not {expected_misses}"
            ))
        } else if path == Path::NextHopCacheMiss && cache_misses != all_runs {
            Err(format!(
                "void: STAT_NEXT_HOP_CACHE_MISS moved {cache_misses} times in {all_runs} runs"
            ))
        } else if path == Path::ServerToClient && cache_misses > 1 {
            // At most the first run's, which fills the slot.
            Err(format!(
                "void: STAT_NEXT_HOP_CACHE_MISS moved {cache_misses} times: the cache did not answer"
            ))
        } else if by_steering
            != if path == Path::ReplyBySteering {
                all_runs
            } else {
                0
            }
        {
            Err(format!(
                "void: STAT_REPLY_BY_STEERING moved {by_steering} times in {all_runs} runs"
            ))
        } else {
            Ok(timings.spreads())
        };
        Ok(Row {
            label,
            mode: setup.mode,
            forwarding: setup.forwarding,
            path,
            frame_len: frame.len(),
            result,
        })
    }

    /// Puts the answer `next_hops` gives for `frame`'s destination into
    /// bench_hop_by_address, under the destination's address.
    fn fill_hop_by_address(&self, frame: &[u8]) -> anyhow::Result<()> {
        let daddr: [u8; 4] = frame
            .get(30..34)
            .context("frame too short for IPv4")?
            .try_into()?;
        // Copy 0's /32 (prefix length 32 after the copy's 32 bits): a publication leaves
        // both copies equal (daemon publish_window.rs).
        let key = NextHopKey {
            prefixlen: 64,
            copy: 0,
            addr: daddr,
        };
        // A lookup in an LPM trie from userspace is a longest-prefix match too.
        let hop = map(self.program.object(), "next_hops")?
            .lookup(&key.to_bytes(), MapFlags::ANY)
            .context("cannot read next_hops")?
            .context("next_hops has no entry for the bench's client")?;
        map(self.program.object(), "bench_hop_by_address")?
            .update(&daddr, &hop, MapFlags::ANY)
            .context("cannot write bench_hop_by_address")
    }

    /// Puts `frame` into bench_frame, the pristine copy every bench program starts from.
    pub(super) fn write_frame(&self, frame: &[u8]) -> anyhow::Result<()> {
        ensure!(
            frame.len() <= BENCH_FRAME_MAX,
            "frame too long for bench_frame"
        );
        let mut value = vec![0u8; 4 + BENCH_FRAME_MAX];
        value[..4].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
        value[4..4 + frame.len()].copy_from_slice(frame);
        map(self.program.object(), "bench_frame")?
            .update(&0u32.to_ne_bytes(), &value, MapFlags::ANY)
            .context("cannot write bench_frame")?;
        Ok(())
    }

    /// Runs `subject` and bench_trivial alternately on `frame` (after untimed warm-up
    /// runs): their durations, and the first action of `subject` that was not `expected`.
    fn time(
        &self,
        subject: &str,
        frame: &[u8],
        ingress: u32,
        runs: u32,
        expected: u32,
        before_run: &dyn Fn(),
    ) -> anyhow::Result<(Timings, Option<u32>)> {
        self.write_frame(frame)?;
        let subject = program(self.program.object(), subject)?;
        let trivial = program(self.program.object(), "bench_trivial")?;
        let before_run = || {
            before_run();
            Ok(())
        };
        time_against(
            &subject,
            &trivial,
            frame,
            ingress,
            runs,
            expected,
            &before_run,
        )
    }
}

/// The ACK echoing `tsecr` with its cookie (TSecr's 16 MSB) changed until it names no
/// server: the first of 2^16 - 1 changes the core drops as `cookie_unknown_server`.
fn forged_cookie(
    worker: &mut Worker,
    ack_echoing: &dyn Fn(u32) -> Vec<u8>,
    tsecr: u32,
) -> anyhow::Result<(Vec<u8>, u32)> {
    for flip in 1..=u32::from(u16::MAX) {
        let forged = ack_echoing(tsecr ^ flip << 16);
        let verdict = worker.process(&mut forged.clone(), FRAMES_AT, Ingress::ServerSide);
        if verdict == Verdict::Drop(DropReason::CookieUnknownServer) {
            return Ok((forged, STAT_DROP_COOKIE_UNKNOWN_SERVER));
        }
    }
    bail!("every cookie names a server: the bench has no unallocated id")
}

/// A router's fragmentation-needed about `seen_by_client` (a server segment as the client
/// got it), quoting `quote_len` bytes of it, checked to be routed to `server` by the core.
fn icmp_error_to(
    worker: &mut Worker,
    seen_by_client: &[u8],
    quote_len: usize,
    server: ServerId,
) -> anyhow::Result<Vec<u8>> {
    let router = u32::from(std::net::Ipv4Addr::new(10, 7, 0, 2));
    let error = testkit::icmp_frag_needed(router, seen_by_client, quote_len);
    let verdict = worker.process(&mut error.clone(), FRAMES_AT, Ingress::ClientSide);
    ensure!(
        verdict == Verdict::ToServer(server),
        "the core routes the bench's ICMP error to {verdict:?}, not to server {}",
        server.0
    );
    Ok(error)
}

/// The client (address, port) of the bench's frames.
pub(super) fn frame_client() -> (u32, u16) {
    (testkit::client_ip(7), CLIENT_PORT)
}

/// One `BPF_PROG_TEST_RUN` of `program` on `frame` as received on `ingress`: its action and
/// the kernel's duration in ns.
// `ProgramInput` is non-exhaustive: no struct literal outside libbpf-rs.
#[allow(clippy::field_reassign_with_default)]
pub(super) fn test_run(
    program: &libbpf_rs::ProgramMut<'_>,
    frame: &[u8],
    ingress: u32,
) -> anyhow::Result<(u32, u32)> {
    let mut context = xdp_md(frame.len() as u32, ingress);
    let mut out = [0u8; BENCH_FRAME_MAX + 256];
    let mut input = ProgramInput::default();
    input.data_in = Some(frame);
    input.data_out = Some(&mut out);
    input.context_in = Some(&mut context);
    input.repeat = 1;
    let output = program
        .test_run(input)
        .context("BPF_PROG_TEST_RUN failed")?;
    Ok((output.return_value, output.duration.as_nanos() as u32))
}

/// `struct xdp_md` for a frame of `len` bytes (no metadata) received on `ingress`, queue 0.
fn xdp_md(len: u32, ingress: u32) -> [u8; 24] {
    let mut md = [0u8; 24];
    // data = 0, data_end = len, data_meta = 0, ingress_ifindex, rx_queue_index = 0,
    // egress_ifindex = 0.
    md[4..8].copy_from_slice(&len.to_ne_bytes());
    md[12..16].copy_from_slice(&ingress.to_ne_bytes());
    md
}

pub(super) fn map<'a>(object: &'a Object, name: &str) -> anyhow::Result<libbpf_rs::Map<'a>> {
    object
        .maps()
        .find(|m| m.name() == name)
        .with_context(|| format!("map {name} is missing from bpf/xdp_bench.c"))
}

pub(super) fn program<'a>(
    object: &'a Object,
    name: &str,
) -> anyhow::Result<libbpf_rs::ProgramMut<'a>> {
    object
        .progs_mut()
        .find(|p| p.name() == name)
        .with_context(|| format!("program {name} is missing from bpf/xdp_bench.c"))
}

/// Empties the program's `next_hops` and `next_hop_hosts`: every reply's next hop from
/// `bpf_fib_lookup`. In a publish window, as the mirror writes them, each copy of the
/// tables while packets read the other (both keys carry the copy in their second word):
/// the flip also voids what `next_hop_cache` holds.
fn clear_next_hops(program: &SteeringProgram) -> anyhow::Result<()> {
    let mut window = program.publish_window()?;
    loop {
        let copy = window.before_write();
        for name in ["next_hops", "next_hop_hosts"] {
            let map = program.try_map(name)?;
            let keys: Vec<Vec<u8>> = map
                .keys()
                .filter(|key| key[4..8] == copy.to_ne_bytes())
                .collect();
            for key in keys {
                map.delete(&key)
                    .with_context(|| format!("cannot delete from {name}"))?;
            }
        }
        if !window.flip() {
            return Ok(());
        }
    }
}

/// Empties map `name` (an array's values zeroed): the entries it held, to put back with
/// [`put_entries`].
fn take_entries(program: &SteeringProgram, name: &str) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let map = program.try_map(name)?;
    let array = map.map_type() == libbpf_rs::MapType::Array;
    let mut entries = Vec::new();
    for key in map.keys().collect::<Vec<_>>() {
        let Some(value) = map.lookup(&key, MapFlags::ANY)? else {
            continue;
        };
        let emptied = if array {
            map.update(&key, &vec![0u8; value.len()], MapFlags::ANY)
        } else {
            map.delete(&key)
        };
        emptied.with_context(|| format!("cannot empty {name}"))?;
        entries.push((key, value));
    }
    Ok(entries)
}

fn put_entries(
    program: &SteeringProgram,
    name: &str,
    entries: &[(Vec<u8>, Vec<u8>)],
) -> anyhow::Result<()> {
    let map = program.try_map(name)?;
    for (key, value) in entries {
        map.update(key, value, MapFlags::ANY)
            .with_context(|| format!("cannot write {name}"))?;
    }
    Ok(())
}

/// A `stats` counter summed over the CPUs.
pub(super) fn stat(object: &Object, index: u32) -> anyhow::Result<u64> {
    let values = map(object, "stats")?
        .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)
        .context("cannot read stats")?
        .unwrap_or_default();
    Ok(values
        .iter()
        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
        .sum())
}

pub(super) fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip (iproute2)")?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The interfaces' MACs, set when they are made: sysfs (`Interface::discover`) shows the
/// namespace it was mounted in, not this one.
const SERVER_INTERFACE_MAC: Mac = [0x02, 0x1b, 0x00, 0x00, 0x00, 0x05];
const CLIENT_INTERFACE_MAC: Mac = [0x02, 0x1b, 0x00, 0x00, 0x00, 0x0c];

fn mac_text(mac: &Mac) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

pub(super) fn interface(name: &str, mac: Mac, slot: u32) -> anyhow::Result<Interface> {
    let cname = std::ffi::CString::new(name)?;
    // SAFETY: a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    ensure!(
        ifindex != 0,
        "interface {name}: {}",
        std::io::Error::last_os_error()
    );
    Ok(Interface {
        name: name.to_string(),
        ifindex,
        mac,
        slot,
        queues: 1,
    })
}

fn ifindex(name: &str) -> anyhow::Result<Port> {
    Ok(Port {
        ifindex: interface(name, [0; 6], 0)?.ifindex,
    })
}

/// Moves the process (still one thread) to a network namespace of its own: `lo` up with
/// IPv4 forwarding (what `cheetah run` sets for the FIB lookups), a veth facing the
/// servers' subnet and one facing the clients through a gateway whose neighbour entry is
/// static, so every server->client run finds its next hop in the kernel.
pub(super) fn enter_new_namespace(routes: u32) -> anyhow::Result<Ports> {
    // SAFETY: unshare only changes this thread's namespaces; the process has no other yet.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        bail!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
    }
    ip(&["link", "set", "lo", "up"])?;
    std::fs::write("/proc/sys/net/ipv4/conf/lo/forwarding", "1")
        .context("cannot turn on forwarding for lo")?;
    for (name, mac, peer) in [
        (SERVER_INTERFACE, SERVER_INTERFACE_MAC, "xb-srv-p"),
        (CLIENT_INTERFACE, CLIENT_INTERFACE_MAC, "xb-cli-p"),
    ] {
        let mac = mac_text(&mac);
        ip(&[
            "link", "add", name, "address", &mac, "type", "veth", "peer", "name", peer,
        ])?;
        ip(&["link", "set", name, "up"])?;
        ip(&["link", "set", peer, "up"])?;
    }
    ip(&["addr", "add", "10.1.255.254/16", "dev", SERVER_INTERFACE])?;
    ip(&["addr", "add", "10.7.0.1/24", "dev", CLIENT_INTERFACE])?;
    let gateway_mac = mac_text(&GATEWAY_MAC);
    ip(&[
        "neigh",
        "replace",
        "10.7.0.2",
        "lladdr",
        &gateway_mac,
        "nud",
        "permanent",
        "dev",
        CLIENT_INTERFACE,
    ])?;
    ip(&[
        "route",
        "add",
        "default",
        "via",
        "10.7.0.2",
        "dev",
        CLIENT_INTERFACE,
    ])?;
    add_client_routes(routes)?;
    Ok(Ports {
        servers: ifindex(SERVER_INTERFACE)?,
        clients: ifindex(CLIENT_INTERFACE)?,
    })
}

/// `count` /32 routes through the clients' gateway in 10.2.0.0/16, from 10.2.0.1 up,
/// skipping the bench's client (10.2.0.7, whose lookup must stay the default route's).
fn add_client_routes(count: u32) -> anyhow::Result<()> {
    if count == 0 {
        return Ok(());
    }
    let client = testkit::client_ip(7);
    let batch: String = (1u32..)
        .map(|n| 0x0a02_0000 | n)
        .filter(|&addr| addr != client)
        .take(count as usize)
        .map(|addr| {
            format!(
                "route add {}/32 via 10.7.0.2 dev {CLIENT_INTERFACE}\n",
                std::net::Ipv4Addr::from(addr)
            )
        })
        .collect();
    let mut child = Command::new("ip")
        .args(["-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("cannot run ip (iproute2)")?;
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), batch.as_bytes())?;
    drop(child.stdin.take());
    ensure!(
        child.wait()?.success(),
        "ip -batch: adding the routes failed"
    );
    Ok(())
}

pub(super) fn read_setting(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

pub(super) fn machine_note(placement: &str, jit: &str) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    format!(
        "machine: {model}, {} cpus, kernel {}, clocksource {}, bpf_stats_enabled {}, bpf_jit_enable {jit}; {placement}; load average {}",
        affinity::cpus(),
        read_setting("/proc/sys/kernel/osrelease"),
        read_setting("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        read_setting("/proc/sys/kernel/bpf_stats_enabled"),
        read_setting("/proc/loadavg")
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn row_line(row: &Row) -> String {
    match &row.result {
        Ok((lb, trivial, net)) => format!(
            "{:<44} lb {:>6.0} ns, trivial {:>6.0} ns, net {:>6.0} ns (p10 {:.0}, p90 {:.0})",
            row.label, lb.median, trivial.median, net.median, net.p10, net.p90
        ),
        Err(void) => format!("{:<44} {void}", row.label),
    }
}

/// The net median of the row of `mode`/`forwarding`/`direction`, if it is not void.
fn net_of(rows: &[Row], mode: Mode, forwarding: Forwarding, path: Path) -> Option<f64> {
    rows.iter()
        .find(|r| r.mode == mode && r.forwarding == forwarding && r.path == path)
        .and_then(|r| r.result.as_ref().ok())
        .map(|(_, _, net)| net.median)
}

fn render(rows: &[Row], markdown: bool) -> String {
    let mut out = String::new();
    let mut line = |cells: Vec<String>| {
        if markdown {
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        } else {
            out.push_str(&format!(
                "{:<44} {:>6} {:>16} {:>16} {:>22}\n",
                cells[0], cells[1], cells[2], cells[3], cells[4]
            ));
        }
    };
    line(
        [
            "path",
            "frame",
            "bench_lb ns median (p10-p90)",
            "bench_trivial ns",
            "lb - trivial ns median (p10-p90)",
        ]
        .map(String::from)
        .to_vec(),
    );
    if markdown {
        line(vec!["---".into(); 5]);
    }
    for row in rows {
        let cells = match &row.result {
            Ok((lb, trivial, net)) => vec![
                row.label.clone(),
                format!("{} B", row.frame_len),
                format!("{:.0} ({:.0}-{:.0})", lb.median, lb.p10, lb.p90),
                format!(
                    "{:.0} ({:.0}-{:.0})",
                    trivial.median, trivial.p10, trivial.p90
                ),
                format!("**{:.0}** ({:.0} to {:.0})", net.median, net.p10, net.p90),
            ],
            Err(void) => vec![
                row.label.clone(),
                format!("{} B", row.frame_len),
                void.clone(),
                String::new(),
                String::new(),
            ],
        };
        line(cells);
    }
    let verdict = |pass: bool| if pass { "PASS" } else { "MISS" };
    // The scan row shows what the cycle saves; weights over the cap are no target's.
    let slowest_syn = rows
        .iter()
        .filter(|r| r.path == Path::Syn && !r.label.contains(WRR_SCAN))
        .filter_map(|r| {
            r.result
                .as_ref()
                .ok()
                .map(|(_, _, net)| (net.median, &r.label))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let established = net_of(rows, Mode::Cheetah, Forwarding::L2, Path::ClientToServer);
    let reply = net_of(rows, Mode::Cheetah, Forwarding::L2, Path::ServerToClient);
    let hash = net_of(rows, Mode::Hash, Forwarding::L2, Path::ClientToServer);
    out.push('\n');
    if let Some(ns) = established {
        out.push_str(&format!(
            "target established client->server (l2) <= {ESTABLISHED_TARGET_NS} ns: {ns:.0} ns, {}\n",
            verdict(ns <= ESTABLISHED_TARGET_NS)
        ));
    }
    if let Some((ns, label)) = slowest_syn {
        out.push_str(&format!(
            "target SYN <= {SYN_TARGET_NS} ns: slowest policy {ns:.0} ns ({label}), {}\n",
            verdict(ns <= SYN_TARGET_NS)
        ));
    }
    if let Some(ns) = reply {
        out.push_str(&format!(
            "target server->client (l2) <= {SERVER_TO_CLIENT_TARGET_NS} ns: {ns:.0} ns, {}\n",
            verdict(ns <= SERVER_TO_CLIENT_TARGET_NS)
        ));
    }
    if let (Some(cheetah), Some(hash)) = (established, hash) {
        let ratio = cheetah / hash;
        out.push_str(&format!(
            "target established <= {ESTABLISHED_OVER_HASH_TARGET}x plain hash (l2): {cheetah:.0} / {hash:.0} ns = {ratio:.2}x, {}\n",
            verdict(ratio <= ESTABLISHED_OVER_HASH_TARGET)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_nearest_rank() {
        let s = spread((1..=11).map(f64::from).collect());
        assert_eq!((s.p10, s.median, s.p90), (2.0, 6.0, 10.0));
    }

    #[test]
    fn xdp_md_puts_the_frame_length_and_ingress_where_the_kernel_reads_them() {
        let md = xdp_md(66, 7);
        assert_eq!(u32::from_ne_bytes(md[4..8].try_into().unwrap()), 66);
        assert_eq!(u32::from_ne_bytes(md[12..16].try_into().unwrap()), 7);
        assert!(md[..4]
            .iter()
            .chain(&md[8..12])
            .chain(&md[16..])
            .all(|b| *b == 0));
    }
}
