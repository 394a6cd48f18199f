//! Live: each testbed server has its own TCP timestamp clock (a tc program on its
//! interface shifts TSval out and TSecr back in; docs/testbed.md, "Server clocks").
//!
//! Through the LB, every server answers; every TSval a server puts on the wire is the
//! host's CLOCK_MONOTONIC in ms plus that server's offset from `testbed.json`, read while
//! its request ran; two servers' TSvals differ by their offsets' difference; and every
//! TSecr reaching a server (before its tc program) is a wire TSval it sent, while its TCP
//! (after the program) rejects none. With `--server-clocks shared` the servers send the
//! host's clock as before.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::support::*;

/// Slack after a request's end for the server's last segments (its FIN, the final ACK).
const AFTER_REQUEST_MS: u64 = 200;

live_tests! {
    fn every_server_sends_its_own_clock_and_gets_it_back() {
        own_clocks_through_the_lb();
    }
    fn shared_clocks_are_the_hosts_clock() {
        shared_clocks();
    }
    fn a_server_with_a_clock_per_client_is_named_and_costs_the_workers_little() {
        a_clock_per_client();
    }
}

const SERVERS: [&str; 4] = ["s1", "s2", "s3", "s4"];

fn own_clocks_through_the_lb() {
    let testbed = Testbed::up("clk", &["--servers", "4", "--clients", "1"]);
    let offsets: BTreeMap<&str, u32> = SERVERS
        .iter()
        .map(|s| (*s, testbed.clock_offset(s)))
        .collect();
    eprintln!("offsets: {offsets:?}");
    // What the rule promises (the unit tests in testbed/clocks.rs check the rest).
    assert_eq!(offsets["s1"], 0);
    assert_eq!(offsets["s4"], 1 << 31);
    let distinct: std::collections::BTreeSet<u32> = offsets.values().copied().collect();
    assert_eq!(distinct.len(), 4, "four servers, four clocks: {offsets:?}");

    let _lb = Lb::start(&testbed, &testbed.config_path());
    let rejected_before: Vec<Option<u64>> = SERVERS
        .iter()
        .map(|s| netstat_counter(&testbed.ns(s), "TcpExt", "TSEcrRejected"))
        .collect();
    let captures: Vec<Capture> = SERVERS
        .iter()
        .map(|s| {
            let path = testbed.dir.join(format!("{s}-clock.pcap"));
            let filter = format!("tcp port 80 and {}", testbed.not_health_probes());
            Capture::start(&testbed.ns(s), "eth0", &filter, &path)
        })
        .collect();

    // rr: consecutive connections go to consecutive servers. Each request's host-clock
    // window, by the server that answered (X-Server).
    let mut windows: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    let url = format!("http://{}/", testbed.vip());
    for _ in 0..12 {
        let before = monotonic_ms();
        let server = curl_write_out(&testbed, "c1", &url, "%header{x-server}", &["-m", "5"]);
        let after = monotonic_ms();
        let server = server.concat();
        assert!(!server.is_empty(), "no X-Server header from {url}");
        windows.entry(server).or_default().push((before, after));
    }
    for s in SERVERS {
        assert!(
            windows.contains_key(s),
            "no request through the LB reached {s}: {windows:?}"
        );
    }

    // Per server: its first wire TSval and the host time it was read at (the middle of
    // the window it falls in).
    let mut first_reading: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    for (s, capture) in SERVERS.iter().zip(captures) {
        let segments = capture.segments();
        let offset = offsets[s];
        let mut sent: HashMap<u16, Vec<u32>> = HashMap::new();
        let mut echoes = 0;
        for segment in &segments {
            let Some((tsval, tsecr)) = segment.timestamps else {
                continue;
            };
            if segment.sport == 80 {
                let host = u64::from(tsval.wrapping_sub(offset));
                let window = windows[*s].iter().find(|(before, after)| {
                    (*before as u32..=(*after + AFTER_REQUEST_MS) as u32).contains(&(host as u32))
                });
                let Some(&(before, after)) = window else {
                    panic!(
                        "{s} sent TSval {tsval:#010x}: minus its offset {offset:#x} that is \
                         {host} ms, in none of its requests' windows {:?}",
                        windows[*s]
                    );
                };
                first_reading
                    .entry(s)
                    .or_insert((tsval, (before + after) / 2));
                sent.entry(segment.dport).or_default().push(tsval);
            } else if segment.dport == 80 && segment.is_ack() {
                let server_tsvals = sent.get(&segment.sport).map_or(&[][..], Vec::as_slice);
                assert!(
                    server_tsvals.contains(&tsecr),
                    "{s} received TSecr {tsecr:#010x} on port {}, not a TSval it sent there \
                     ({server_tsvals:x?})",
                    segment.sport
                );
                echoes += 1;
            }
        }
        assert!(echoes > 0, "{s}: no echo captured");
        eprintln!("{s}: {} segments, {echoes} echoes checked", segments.len());
    }

    // Two servers' clocks differ by their offsets' difference, give or take the time
    // between the readings and the windows' width.
    for (a, &(tsval_a, host_a)) in &first_reading {
        for (b, &(tsval_b, host_b)) in &first_reading {
            let wire = tsval_a.wrapping_sub(tsval_b);
            let expected = offsets[a]
                .wrapping_sub(offsets[b])
                .wrapping_add(host_a.wrapping_sub(host_b) as u32);
            let error = wire.wrapping_sub(expected) as i32;
            assert!(
                error.abs() < 1_000,
                "{a} - {b}: wire TSvals differ by {wire:#x}, offsets and host times say \
                 {expected:#x}"
            );
        }
    }

    // The servers' TCP saw their own clock echoed: on kernels that check the handshake's
    // TSecr (6.15 and later), a wrong one would count here and fail the connection.
    for (s, before) in SERVERS.iter().zip(rejected_before) {
        if let Some(before) = before {
            let now = netstat_counter(&testbed.ns(s), "TcpExt", "TSEcrRejected").unwrap();
            assert_eq!(now - before, 0, "{s} rejected TSecr values");
        }
    }
}

fn shared_clocks() {
    let testbed = Testbed::up(
        "clks",
        &[
            "--servers",
            "2",
            "--clients",
            "0",
            "--server-clocks",
            "shared",
        ],
    );
    for s in ["s1", "s2"] {
        assert_eq!(testbed.clock_offset(s), 0, "{s}");
        let filters = in_netns_ok(
            &testbed.ns(s),
            "tc",
            &["filter", "show", "dev", "eth0", "egress"],
        );
        assert!(filters.trim().is_empty(), "{s} has tc filters: {filters}");
    }
    // No LB needed: c0's gateway is the LB's namespace, made to forward to the servers' own
    // addresses here (the testbed leaves it off, as cheetah needs it).
    set_sysctl(&testbed.ns("lb"), "net.ipv4.ip_forward", "1");
    for id in testbed.server_ids() {
        let s = format!("s{id}");
        let (dip, _) = testbed.server(id);
        let path = testbed.dir.join(format!("{s}-shared.pcap"));
        let capture = Capture::start(&testbed.ns(&s), "eth0", "tcp src port 80", &path);
        let before = monotonic_ms();
        in_netns_ok(
            &testbed.ns("c0"),
            "curl",
            &[
                "-s",
                "-m",
                "5",
                "-o",
                "/dev/null",
                &format!("http://{dip}/"),
            ],
        );
        let after = monotonic_ms();
        let tsvals: Vec<u32> = capture
            .segments()
            .into_iter()
            .filter_map(|t| t.timestamps)
            .map(|(tsval, _)| tsval)
            .collect();
        assert!(!tsvals.is_empty(), "{s}: no TSval captured");
        for tsval in tsvals {
            assert!(
                (before as u32..=(after + AFTER_REQUEST_MS) as u32).contains(&tsval),
                "{s}: TSval {tsval} is not the host's clock ({before}..{after})"
            );
        }
    }
}

/// How long the misconfigured server's load runs.
const MISCONFIGURED_FOR: Duration = Duration::from_secs(8);

/// A server left at Linux's default `tcp_timestamps=1` sends every peer its own TSval
/// offset: to the LB's health probes one clock, to each client host another. No LB can
/// correct that (docs/design.md, "Unstable clocks"); what an operator must get is the
/// server named, the anomaly counted, and no flood of work: the XDP program forwards
/// such replies itself as the core does (nothing learnt) and hands up at most one a
/// second per CPU as a sample for the workers' warning.
///
/// s2 runs `tcp_timestamps=1`, s1 the testbed's `2`; two clients (two host pairs) load
/// the VIP. Checked: the kernel counted the anomalies (`server_ts_clock_unstable` or
/// `server_ts_ahead_of_real_time`, worker `xdp`) and handed up under `clock` no more than
/// one a second per CPU; the LB's log warns about server 2 and never server 1; s2's own TCP
/// refuses echoes of the wrong clock (`TSEcrRejected`), s1's none.
fn a_clock_per_client() {
    let testbed = Testbed::up("ckm", &["--servers", "2", "--clients", "2"]);
    let misconfigured = testbed.ns("s2");
    set_sysctl(&misconfigured, "net.ipv4.tcp_timestamps", "1");
    let rejected = |s: &str| netstat_counter(&testbed.ns(s), "TcpExt", "TSEcrRejected");
    let rejected_before = (rejected("s1"), rejected("s2"));
    let lb = Lb::start(&testbed, &testbed.config_path());
    let window = Instant::now();
    let before = lb.metrics();
    let loads: Vec<Loadgen> = ["c0", "c1"]
        .iter()
        .map(|c| {
            Loadgen::start_until_finished(
                &testbed,
                c,
                &format!("per-pair-{c}"),
                &[
                    "--keepalive",
                    "4",
                    "--short-rate",
                    "20/s",
                    "--request-timeout",
                    "2s",
                ],
            )
        })
        .collect();
    std::thread::sleep(MISCONFIGURED_FOR);
    let reports: Vec<_> = loads.into_iter().map(Loadgen::finish).collect();
    // The kernel's counts reach /metrics within a second.
    std::thread::sleep(Duration::from_millis(1_500));
    let after = lb.metrics();
    let window = window.elapsed();

    let kernel = |metrics: &str| {
        kernel_event(metrics, "server_ts_clock_unstable")
            + kernel_event(metrics, "server_ts_ahead_of_real_time")
    };
    let anomalies_in_kernel = kernel(&after) - kernel(&before);
    let handed_up = handed_up_between(&before, &after)
        .get("clock")
        .copied()
        .unwrap_or(0) as f64;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    // One sample a second per CPU between the two scrapes, plus what the first scrape
    // missed: /metrics reads the kernel's counters once a second.
    let allowed = cpus * (window.as_secs_f64().ceil() + 2.0);
    let log = std::fs::read_to_string(lb.log.with_extension("1.log")).unwrap_or_default();
    let warned = |id: u16| {
        log.lines()
            .filter(|l| l.contains("WARN") && l.contains(&format!("server {id}")))
            .filter(|l| l.contains("TCP timestamp"))
            .count()
    };
    let rejected_after = (rejected("s1"), rejected("s2"));
    eprintln!(
        "tcp_timestamps=1 on s2, {window:?} between the scrapes: anomalies forwarded by the kernel {anomalies_in_kernel}, handed up as clock samples {handed_up} (allowed {allowed}); warnings about server 2: {}, server 1: {}; TSEcrRejected s1 {:?} -> {:?}, s2 {:?} -> {:?}; broken: {:?}",
        warned(2),
        warned(1),
        rejected_before.0,
        rejected_after.0,
        rejected_before.1,
        rejected_after.1,
        reports
            .iter()
            .map(|r| r["connections_broken"].as_u64())
            .collect::<Vec<_>>(),
    );
    assert!(
        anomalies_in_kernel >= 20.0,
        "the XDP program forwarded only {anomalies_in_kernel} replies of a server with a clock per peer"
    );
    assert!(
        handed_up <= allowed,
        "{handed_up} clock samples handed up in {window:?}, more than one a second per CPU ({allowed})"
    );
    assert!(warned(2) >= 1, "no warning names server 2:\n{log}");
    assert_eq!(warned(1), 0, "a warning names server 1:\n{log}");
    if let ((Some(s1_before), Some(s1_after)), (Some(s2_before), Some(s2_after))) = (
        (rejected_before.0, rejected_after.0),
        (rejected_before.1, rejected_after.1),
    ) {
        assert_eq!(s1_after, s1_before, "s1 rejected echoes of its own clock");
        assert!(
            s2_after > s2_before,
            "s2 rejected no echo: was its clock ever wrong?"
        );
    }
}
