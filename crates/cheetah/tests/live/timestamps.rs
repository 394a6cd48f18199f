//! Live: servers get back exactly the timestamps they sent, on real TCP stacks, across a
//! change of each one's timestamp MSB (LB-side timestamp correction, paper appendix C.1).
//!
//! Captures on the servers' own interfaces (after the LB, before their TCP) must show that
//! every TSecr a server receives equals a TSval that server sent on that connection, for
//! at least [`MIN_CHECKED_PER_VERSION`] packets with each value of the version bit (the
//! parity of the server's MSB); that no host receives new data with an older TSval; and no
//! PAWS drop on any client or server but of late copies a retransmission overtook (see
//! [`ArrivalOrder`] and docs/timestamps.md). The testbed's
//! servers run `tcp_timestamps=2`: TSval is the kernel's `CLOCK_MONOTONIC` in
//! milliseconds, one clock for every namespace, and each server's tc program adds its own
//! offset on the wire (`testbed.json`), so each server's MSB changes every 65.536 s at its
//! own moments: s1 on the host's, s2 halfway between, s3 at the 32-bit wrap of its TSval
//! (0xffffffff -> 0) a minute or so after `up`. The run is timed from the servers' TSvals
//! to cover each server's next change with load on both sides. The captures on the
//! servers' interfaces see wire values (tc runs after the capture point on ingress and
//! before it on egress), so the check compares the LB's restore with what it saw sent.
//!
//! The second test runs the LB with the restore switched off (`--fault
//! skip-tsecr-restore`) and shows that the same check fails.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::support::*;

/// Packets checked for each value of the version bit.
const MIN_CHECKED_PER_VERSION: u64 = 1000;
/// One MSB period of a 1 ms timestamp clock.
const MSB_PERIOD_MS: u64 = 1 << 16;
/// Load on each side of the MSB change: at about 100 checked packets a second, twice what
/// each version needs.
const LOAD_AROUND_CHANGE_MS: u64 = 20_000;
/// From planning the run to the load running (loadgen's start and its sessions' spread).
const LOAD_START_MS: u64 = 3_000;
/// The servers of both tests: s3's clock wraps a minute or so after `up`.
const SERVERS: [&str; 3] = ["s1", "s2", "s3"];
/// Header-only captures: Ethernet, IPv4 and TCP with the longest options fit.
const SNAPLEN: u32 = 128;

#[test]
fn servers_get_back_exactly_their_own_timestamps_across_an_msb_change() {
    if let Some(_alone) =
        live_scenario("servers_get_back_exactly_their_own_timestamps_across_an_msb_change")
    {
        restore_is_exact_across_an_msb_change();
    }
}

#[test]
fn without_the_tsecr_restore_the_timestamp_check_fails() {
    if let Some(_alone) = live_scenario("without_the_tsecr_restore_the_timestamp_check_fails") {
        check_fails_without_the_restore();
    }
}

fn restore_is_exact_across_an_msb_change() {
    let testbed = Testbed::up("ts", &["--servers", "3", "--clients", "1"]);
    let lb = Lb::start(&testbed, &testbed.config_path());

    let offsets: Vec<u32> = SERVERS.iter().map(|s| testbed.clock_offset(s)).collect();
    let now_ms = host_clock_ms(&testbed, &offsets);
    let plan = RunPlan::covering_the_next_msb_changes(now_ms, &offsets);
    for (s, (offset, change_in_ms)) in SERVERS.iter().zip(offsets.iter().zip(&plan.changes_in_ms)) {
        let tsval = (now_ms as u32).wrapping_add(*offset);
        eprintln!(
            "{s}: TSval {tsval:#010x} (offset {offset:#x}), its MSB changes in {} s",
            change_in_ms / 1000
        );
    }
    eprintln!("running the load {} s", plan.duration_ms / 1000);

    let paws = PawsCounters::read(&testbed);
    let captures = Captures::start(&testbed, "restore", &["c0", "c1"]);
    let duration = format!("{}ms", plan.duration_ms);
    // Keep-alive sessions give a steady stream of echoes on both sides of the change; idle
    // sessions (30 s gaps with nothing on the wire: the servers send no keepalive probes)
    // echo TSvals up to 30 s old; short connections add handshakes and closes.
    // (`idle.rs` waits longer.)
    let keepalive = Loadgen::start(
        &testbed,
        "c1",
        "ts-keepalive",
        &[
            "--duration",
            &duration,
            "--keepalive",
            "60",
            "--idle-sessions",
            "10",
            "--idle-gap",
            "30s",
            "--short-rate",
            "5/s",
        ],
    );
    let direct = Loadgen::start(
        &testbed,
        "c0",
        "ts-direct",
        &[
            "--duration",
            &duration,
            "--keepalive",
            "20",
            "--short-rate",
            "2/s",
        ],
    );
    let keepalive = keepalive.finish();
    let direct = direct.finish();
    let check = captures.finish_and_check();
    eprintln!("{check:#?}");

    assert_nothing_broken(&keepalive, "keep-alive load across an MSB change");
    assert_nothing_broken(&direct, "load from the LB's segment across an MSB change");
    assert!(
        check.mismatches.is_empty(),
        "{} TSecr values a server never sent on that connection, e.g. {:#?}",
        check.mismatch_count,
        check.mismatches
    );
    assert_eq!(
        check.unknown_connections, 0,
        "echoes on connections whose start the captures missed"
    );
    for version in 0..2 {
        assert!(
            check.checked_by_version[version] >= MIN_CHECKED_PER_VERSION,
            "only {} checked echoes with version bit {version}: {check:#?}",
            check.checked_by_version[version]
        );
    }
    assert!(
        check.late_echoes > 0,
        "no echo of an older MSB arrived after a server's MSB changed, so the restore to M - 1 \
         was not exercised: {check:#?}"
    );
    let paws = paws.since();
    eprintln!(
        "TCP counters over the run: PAWSEstab {:#?}, others {:#?}",
        paws.pawsestab, paws.others
    );
    // The LB's own drops (a full TX ring under load) cause retransmissions, which is what
    // can make a flow change LB worker (see `ArrivalOrder`).
    for line in lb.metrics().lines() {
        let drops =
            line.starts_with("cheetah_io_tx_ring_full") || line.starts_with("cheetah_drops_total");
        if drops && !line.ends_with(" 0") {
            eprintln!("{line}");
        }
    }
    for (namespace, order) in &check.arrival {
        assert_eq!(
            order.backwards, 0,
            "{namespace} received new data with an older TSval: {order:#?}"
        );
    }
    // No PAWS drop, but for late copies that a retransmission overtook: PAWS is right to
    // drop those, and they say nothing about the timestamps.
    for (namespace, drops) in &paws.pawsestab {
        let overtaken = check
            .arrival
            .iter()
            .find(|(n, _)| n == namespace)
            .map_or(0, |(_, order)| order.overtaken);
        assert!(
            *drops <= overtaken,
            "{namespace}: {drops} PAWS drops on established connections, {overtaken} late \
             copies to explain them: {check:#?}"
        );
    }
}

fn check_fails_without_the_restore() {
    let testbed = Testbed::up("tsf", &["--servers", "3", "--clients", "1"]);
    let _lb = Lb::start_with_args(
        &testbed,
        &testbed.config_path(),
        &["--fault", "skip-tsecr-restore"],
    );
    let paws = PawsCounters::read(&testbed);
    let captures = Captures::start(&testbed, "fault", &["c1"]);
    let load = Loadgen::start(
        &testbed,
        "c1",
        "tsf-keepalive",
        &[
            "--duration",
            "10s",
            "--keepalive",
            "20",
            "--short-rate",
            "5/s",
        ],
    );
    let report = load.finish();
    let check = captures.finish_and_check();
    let paws = paws.since();
    eprintln!(
        "with the restore off: {check:#?}\nTCP counters: PAWSEstab {:#?}, others {:#?}",
        paws.pawsestab, paws.others
    );
    eprintln!(
        "loadgen with the restore off: {} broken, {}",
        report["connections_broken"], report["broken_by_kind"]
    );

    let echoes = check.checked_by_version.iter().sum::<u64>() + check.mismatch_count;
    assert!(
        echoes > 200,
        "too little traffic reached the servers: {check:#?}"
    );
    // A cookie equals the server's own MSB by chance once in 65536 connections.
    assert!(
        check.mismatch_count * 10 >= echoes * 9,
        "the check should flag nearly every echo when the LB leaves cookies in TSecr: \
         {check:#?}"
    );
}

/// The host's TCP clock now, in ms, after checking it against a TSval each server sent:
/// with `tcp_timestamps=2` Linux sends `CLOCK_MONOTONIC` in milliseconds with no
/// per-connection offset, and the server's tc program adds its offset on the wire.
fn host_clock_ms(testbed: &Testbed, offsets: &[u32]) -> u64 {
    let captures: Vec<Capture> = SERVERS
        .iter()
        .map(|s| {
            let path = testbed.dir.join(format!("{s}-clock.pcap"));
            let filter = format!("tcp src port 80 and {}", testbed.not_health_probes());
            Capture::start(&testbed.ns(s), "eth0", &filter, &path)
        })
        .collect();
    let before = monotonic_ms();
    let url = format!("http://{}/", testbed.vip());
    // rr keeps a cursor per LB worker, and a connection lands on the worker its hash
    // picks: requests go on until every server has answered one (X-Server), not one each.
    let mut answered = std::collections::HashSet::new();
    for _ in 0..10 * SERVERS.len() {
        let server = curl_write_out(testbed, "c1", &url, "%header{x-server}", &["-m", "10"]);
        answered.insert(server.concat());
        if SERVERS.iter().all(|s| answered.contains(*s)) {
            break;
        }
    }
    let after = monotonic_ms();
    for ((s, capture), offset) in SERVERS.iter().zip(captures).zip(offsets) {
        let tsval = capture
            .segments()
            .into_iter()
            .filter_map(|t| t.timestamps)
            .map(|(tsval, _)| tsval)
            .next()
            .unwrap_or_else(|| panic!("no TSval captured at {s}"));
        let host = tsval.wrapping_sub(*offset);
        assert!(
            (before as u32..=after as u32 + 1).contains(&host),
            "{s}'s TSval {tsval:#x} minus its offset {offset:#x} is {host}, not \
             CLOCK_MONOTONIC in ms ({before}..{after}): are the servers running \
             tcp_timestamps=2 and their clock programs?"
        );
    }
    // Time has moved on since: the monotonic clock is the same clock, read now.
    monotonic_ms()
}

/// When each server's MSB next changes and how long to run the load so that it runs
/// [`LOAD_AROUND_CHANGE_MS`] on both sides of each server's change.
#[derive(Debug, PartialEq)]
struct RunPlan {
    /// Per server, in the order of the offsets given.
    changes_in_ms: Vec<u64>,
    duration_ms: u64,
}

impl RunPlan {
    fn covering_the_next_msb_changes(now_ms: u64, offsets: &[u32]) -> Self {
        let changes_in_ms: Vec<u64> = offsets
            .iter()
            .map(|offset| {
                let clock = u64::from((now_ms as u32).wrapping_add(*offset));
                let mut change_in_ms = MSB_PERIOD_MS - clock % MSB_PERIOD_MS;
                if change_in_ms < LOAD_START_MS + LOAD_AROUND_CHANGE_MS {
                    // Too close to load both sides: take the one after.
                    change_in_ms += MSB_PERIOD_MS;
                }
                change_in_ms
            })
            .collect();
        let last = changes_in_ms.iter().copied().max().unwrap_or(0);
        RunPlan {
            changes_in_ms,
            duration_ms: last + LOAD_AROUND_CHANGE_MS,
        }
    }
}

#[test]
fn a_run_covers_each_servers_msb_change_with_load_on_both_sides() {
    // 40 s before s1's change, s2 half a period off: run until 20 s after the later one.
    let plan = RunPlan::covering_the_next_msb_changes(5 * MSB_PERIOD_MS - 40_000, &[0, 98_304]);
    assert_eq!(
        plan,
        RunPlan {
            changes_in_ms: vec![40_000, 72_768],
            duration_ms: 92_768
        }
    );
    // 10 s before a change: too close, the next one is 75.5 s away.
    let plan = RunPlan::covering_the_next_msb_changes(5 * MSB_PERIOD_MS - 10_000, &[0]);
    assert_eq!(plan.changes_in_ms, [10_000 + MSB_PERIOD_MS]);
    // A clock about to wrap: the wrap is its change.
    let plan = RunPlan::covering_the_next_msb_changes(1_000_000, &[u32::MAX - 1_000_000 - 59_999]);
    assert_eq!(plan.changes_in_ms, [60_000]);
    // Never longer than a period and two margins, never shorter than two margins.
    for now in (0..3 * MSB_PERIOD_MS).step_by(997) {
        let offsets = [0, 98_304, 0xfff0_1234, 1 << 31];
        let plan = RunPlan::covering_the_next_msb_changes(now, &offsets);
        assert!(plan.duration_ms <= MSB_PERIOD_MS + LOAD_START_MS + 2 * LOAD_AROUND_CHANGE_MS);
        for (offset, change_in_ms) in offsets.iter().zip(&plan.changes_in_ms) {
            assert!(*change_in_ms >= LOAD_START_MS + LOAD_AROUND_CHANGE_MS);
            let at = u64::from((now as u32).wrapping_add(*offset)) + change_in_ms;
            assert_eq!(at % MSB_PERIOD_MS, 0);
        }
    }
}

/// `tcp port 80` on every server's and client's own interface, headers only.
struct Captures {
    /// (namespace, capture)
    servers: Vec<(String, Capture)>,
    clients: Vec<(String, Capture)>,
}

impl Captures {
    fn start(testbed: &Testbed, name: &str, clients: &[&str]) -> Self {
        let start = |role: &str| {
            let path: PathBuf = testbed.dir.join(format!("{role}-{name}.pcap"));
            let capture = Capture::start_with_snaplen(
                &testbed.ns(role),
                "eth0",
                "tcp port 80",
                &path,
                Some(SNAPLEN),
            );
            (testbed.ns(role), capture)
        };
        Captures {
            servers: SERVERS.iter().map(|s| start(s)).collect(),
            clients: clients.iter().map(|c| start(c)).collect(),
        }
    }

    fn finish_and_check(self) -> TsecrCheck {
        let mut check = TsecrCheck::default();
        for (namespace, capture) in self.servers {
            let segments = capture.segments();
            check.add_server_capture(&segments);
            let order = ArrivalOrder::of(&segments, |t| t.dport == 80);
            check.arrival.push((namespace, order));
        }
        for (namespace, capture) in self.clients {
            let order = ArrivalOrder::of(&capture.segments(), |t| t.sport == 80);
            check.arrival.push((namespace, order));
        }
        check
    }
}

/// Source address and port, destination address and port.
type Connection = ([u8; 4], u16, [u8; 4], u16);

/// Segments that reached a host with a TSval older (by more than PAWS's one-tick window)
/// than one it had already received on that connection, in two kinds:
///
/// - *overtaken*: carrying no sequence space beyond what had arrived, i.e. a late copy
///   (the original of a segment whose retransmission came first). PAWS drops these when
///   they are not pure ACKs, as it should; the LB only delivers one late when one flow's
///   packets took two LB workers (see docs/timestamps.md);
/// - *backwards*: carrying new data or a new FIN. Only a timestamp that really went
///   backwards does that, which is what the cookie in TSval must never cause.
#[derive(Debug, Default)]
struct ArrivalOrder {
    overtaken: u64,
    backwards: u64,
    examples: Vec<String>,
}

impl ArrivalOrder {
    fn of(segments: &[TcpView], incoming: impl Fn(&TcpView) -> bool) -> Self {
        let mut order = ArrivalOrder::default();
        // Per connection: the newest TSval so far and the end of the sequence space seen.
        let mut seen: HashMap<Connection, (u32, u32)> = HashMap::new();
        for (at, segment) in segments.iter().enumerate() {
            let Some((tsval, _)) = segment.timestamps else {
                continue;
            };
            let key = (segment.src, segment.sport, segment.dst, segment.dport);
            if segment.is_syn() {
                // A new connection on a 4-tuple used before (ports come back after
                // TIME_WAIT): its timestamps start afresh, and after a change of the server's
                // MSB its cookie's version bit differs from the old connection's.
                seen.remove(&key);
                seen.remove(&(segment.dst, segment.dport, segment.src, segment.sport));
                continue;
            }
            if !incoming(segment) {
                continue;
            }
            let fin = u32::from(segment.flags & 0x01 != 0);
            let end = segment
                .seq
                .wrapping_add(segment.payload_len as u32)
                .wrapping_add(fin);
            let Some(&(newest, seen_end)) = seen.get(&key) else {
                seen.insert(key, (tsval, end));
                continue;
            };
            let new_space = (end.wrapping_sub(seen_end) as i32) > 0;
            if (newest.wrapping_sub(tsval) as i32) > 1 {
                let kind = if new_space {
                    order.backwards += 1;
                    "backwards"
                } else {
                    order.overtaken += 1;
                    "overtaken"
                };
                if order.examples.len() < 5 {
                    order.examples.push(format!(
                        "{kind}: {}:{} -> {}:{} TSval {tsval:#010x} after {newest:#010x}, \
                         flags {:#04x} seq {} len {} (frame {at})",
                        std::net::Ipv4Addr::from(segment.src),
                        segment.sport,
                        std::net::Ipv4Addr::from(segment.dst),
                        segment.dport,
                        segment.flags,
                        segment.seq,
                        segment.payload_len,
                    ));
                }
            }
            let entry = seen.get_mut(&key).unwrap();
            if (tsval.wrapping_sub(entry.0) as i32) > 0 {
                entry.0 = tsval;
            }
            if new_space {
                entry.1 = end;
            }
        }
        order
    }
}

/// What the servers' captures say about the TSecr values they received.
#[derive(Debug, Default)]
struct TsecrCheck {
    /// Client segments whose TSecr is a TSval the server sent earlier on that connection,
    /// by version bit (bit 16 of the TSecr: the parity of the server's MSB).
    checked_by_version: [u64; 2],
    /// Of those, echoes of an older MSB than the newest the server had sent by then (on any
    /// connection): what the LB restores to M - 1.
    late_echoes: u64,
    /// TSecr values the server never sent on that connection: all of them counted, the
    /// first few described.
    mismatch_count: u64,
    mismatches: Vec<String>,
    /// Client segments on connections whose server packets the capture did not see.
    unknown_connections: u64,
    /// Per host (namespace): segments that arrived with an older TSval.
    arrival: Vec<(String, ArrivalOrder)>,
}

impl TsecrCheck {
    fn add_server_capture(&mut self, segments: &[TcpView]) {
        // Per connection (client address and port): every TSval the server sent on it.
        let mut sent: HashMap<([u8; 4], u16), Vec<u32>> = HashMap::new();
        let mut newest_msb: Option<u16> = None;
        for segment in segments {
            let Some((tsval, tsecr)) = segment.timestamps else {
                continue;
            };
            if segment.sport == 80 {
                sent.entry((segment.dst, segment.dport))
                    .or_default()
                    .push(tsval);
                let msb = (tsval >> 16) as u16;
                // Serial-number order, as the MSB wraps.
                if newest_msb.is_none_or(|m| (msb.wrapping_sub(m) as i16) > 0) {
                    newest_msb = Some(msb);
                }
                continue;
            }
            // A client segment: everything but the SYN acknowledges, and echoes.
            if segment.dport != 80 || !segment.is_ack() {
                continue;
            }
            let Some(server_tsvals) = sent.get(&(segment.src, segment.sport)) else {
                self.unknown_connections += 1;
                continue;
            };
            if server_tsvals.contains(&tsecr) {
                self.checked_by_version[(tsecr >> 16) as usize & 1] += 1;
                if newest_msb.is_some_and(|m| (tsecr >> 16) as u16 != m) {
                    self.late_echoes += 1;
                }
            } else {
                self.mismatch_count += 1;
                if self.mismatches.len() < 10 {
                    self.mismatches.push(format!(
                        "{}:{} flags {:#04x}: TSecr {tsecr:#010x}, the server sent {} TSvals \
                         on it, the last {:#010x}",
                        std::net::Ipv4Addr::from(segment.src),
                        segment.sport,
                        segment.flags,
                        server_tsvals.len(),
                        server_tsvals.last().unwrap()
                    ));
                }
            }
        }
    }
}

/// TCP counters of the clients and servers that take part, to compare before and after.
struct PawsCounters {
    namespaces: Vec<String>,
    before: Vec<[u64; COUNTERS.len()]>,
}

/// `PAWSEstab` must stay 0; the others are printed for docs/timestamps.md (0 where the
/// kernel does not have them: `PAWSOldAck` and `TSEcrRejected` are recent).
const COUNTERS: [&str; 7] = [
    "PAWSEstab",
    "PAWSOldAck",
    "PAWSTimewait",
    "TSEcrRejected",
    "TcpTimeoutRehash",
    "TCPDuplicateDataRehash",
    "TCPSpuriousRTOs",
];

struct PawsDeltas {
    pawsestab: Vec<(String, u64)>,
    others: Vec<(String, &'static str, u64)>,
}

impl PawsCounters {
    fn read(testbed: &Testbed) -> Self {
        let namespaces: Vec<String> = ["c0", "c1"]
            .iter()
            .chain(&SERVERS)
            .map(|r| testbed.ns(r))
            .collect();
        let before = namespaces.iter().map(|ns| Self::now(ns)).collect();
        PawsCounters { namespaces, before }
    }

    fn now(namespace: &str) -> [u64; COUNTERS.len()] {
        COUNTERS.map(|name| {
            let value = netstat_counter(namespace, "TcpExt", name);
            match name {
                "PAWSEstab" => value.expect("every kernel counts TcpExt:PAWSEstab"),
                _ => value.unwrap_or(0),
            }
        })
    }

    fn since(&self) -> PawsDeltas {
        let mut deltas = PawsDeltas {
            pawsestab: Vec::new(),
            others: Vec::new(),
        };
        for (namespace, before) in self.namespaces.iter().zip(&self.before) {
            let now = Self::now(namespace);
            for (i, name) in COUNTERS.iter().enumerate() {
                let delta = now[i] - before[i];
                if i == 0 {
                    deltas.pawsestab.push((namespace.clone(), delta));
                } else if delta > 0 {
                    deltas.others.push((namespace.clone(), name, delta));
                }
            }
        }
        deltas
    }
}
