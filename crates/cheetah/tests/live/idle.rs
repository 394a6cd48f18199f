//! Live: HTTP keep-alive connections that sit idle between two requests survive idle gaps
//! of 70, 200 and 330 s and one just under the cookie layout's limit, through `cheetah run`
//! (l2, rr, 2 nginx servers, Linux clients in namespaces), with nothing on the wire during
//! a gap: the testbed's servers send no TCP keepalive probes (nginx's default) and keep an
//! idle connection 600 s (docs/testbed.md). Also: nginx's default 75 s `keepalive_timeout`
//! closes an idle connection, and the client must see that FIN. Issue 18.
//!
//! For cheetah mode, per gap: no connection breaks (every request after a gap gets its
//! whole response on the connection it started with), `TcpExtPAWSEstab` stays 0 in every
//! client namespace, and every TSecr a server receives equals a TSval that server sent on
//! that connection, checked from captures on the servers' interfaces by the tests' own
//! parser ([`crate::support::echoes`]), not by the core's cookie code.
//!
//! The same scenario runs at the same time through a hash-mode LB (no cookies, TSval
//! untouched) on a second testbed, as the control: it shows that nothing else in the
//! testbed breaks an idle connection (nginx's or loadgen's timeouts, the router, ARP and
//! the LB's neighbour lookups after minutes of silence; the namespaces load no conntrack
//! rules) and that the checks pass where the timestamps are the servers' own.
//!
//! Why it fails without epoch bits in the cookie (the layout of the main branch until
//! issue 18: one version bit, the parity of the server's timestamp MSB, above 15 id bits):
//! the TSval a client sees then repeats every 2^17 ms, and a client drops the server's
//! first segment after a gap D whenever D mod 131.072 s >= 65.536 s, which holds for every
//! gap here (70, 68.9, 67.9 and 126.8 s remain) and for the FIN 75 s after the last
//! response. Keepalive probes would not have helped: a probe fails the client's sequence
//! check, so it never refreshes the client's TS.Recent. And the restore, which picks the
//! server's current MSB or the one before, gives the server a TSecr it never sent for any
//! echo older than 65.5 s. On that code (main at 72441d9, debug build, 8 connections per
//! gap) one run gave, through cheetah:
//!
//! | gap | broken | client PAWS drops | echoes after a gap exact / wrong | all wrong echoes |
//! |---|---|---:|---:|---:|
//! | 90 s, nginx closes at 75 s | 4 of 4 `reset` (the FIN never arrived) | 32 | 0 / 4 | 36 |
//! | 70 s | 8 of 8 `timeout` | 160 | 2 / 6 | 230 |
//! | 200 s | 8 of 8 `timeout` | 160 | 0 / 8 | 232 |
//! | 330 s | 8 of 8 `timeout` | 160 | 0 / 8 | 232 |
//! | 520 s | 0 | 96 | 0 / 8 | 136 |
//!
//! and through hash mode 0 broken (the 4 FINs seen at 75.0-75.8 s), 0 PAWS drops and every
//! echo exact. The 520 s connections did not break: 520 s is 4.3 s short of 4 x 131.072 s,
//! so the server's retransmissions caught up with the client's TS.Recent within loadgen's
//! 10 s request timeout; the PAWS drops and the wrong echoes still fail the test.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::support::echoes::{EchoCheck, EchoCounts};
use crate::support::*;
use cheetah_core::cookie::CookieLayout;
use serde_json::Value;

/// The longest idle gap tested: 4 s under what the testbed's cookie layout guarantees,
/// 2^(k-1) x 65.536 s = 524.288 s with the default k = 4 epoch bits (the 4 s leave room
/// for the request and response times around the gap).
const LAYOUT_LIMIT_GAP_SECS: u64 = CookieLayout::DEFAULT.max_idle_ms() / 1000 - 4;
/// Gaps past one MSB period (70 s), past the 200 s and 300 s that browsers and proxies
/// keep idle sockets, and at the limit.
const GAPS_SECS: [u64; 4] = [70, 200, 330, LAYOUT_LIMIT_GAP_SECS];
/// Connections per gap: they start within a second, so they see different phases of the
/// servers' 1 ms clock only by the luck of the start; several are there for the count.
const SESSIONS_PER_GAP: usize = 8;
/// How long the gap loads run: the longest gap once, with room for its second request.
const LOAD_SECS: u64 = LAYOUT_LIMIT_GAP_SECS + 20;
/// The testbed's path with nginx's default `keepalive_timeout` (`testbed/nginx.rs`).
const NGINX_DEFAULT_TIMEOUT_PATH: &str = "/keepalive-75s";
const NGINX_DEFAULT_TIMEOUT_SECS: f64 = 75.0;
/// Longer than nginx's timeout, so the FIN comes while the client waits.
const FIN_GAP_SECS: u64 = 90;
const FIN_SESSIONS: usize = 4;
/// Header-only captures: Ethernet, IPv4 and TCP with the longest options fit.
const SNAPLEN: u32 = 128;
/// Beyond the loads' own ends: testbed and LB start, loadgen's stop grace.
const DEADLINE_MARGIN: Duration = Duration::from_secs(90);

#[test]
fn idle_keepalive_connections_survive_gaps_up_to_the_layout_limit() {
    let Some(_alone) =
        live_scenario("idle_keepalive_connections_survive_gaps_up_to_the_layout_limit")
    else {
        return;
    };
    // Both start before either is waited for: the test takes the longest load once.
    let cheetah = IdleRun::start("idc", "cheetah");
    let hash = IdleRun::start("idh", "hash");
    let deadline = Instant::now() + Duration::from_secs(LOAD_SECS) + DEADLINE_MARGIN;
    let hash = hash.finish(deadline);
    let cheetah = cheetah.finish(deadline);

    let mut table = String::new();
    for outcome in [&cheetah, &hash] {
        table.push_str(&outcome.table());
    }
    eprintln!("\n{table}");
    let control = hash.violations();
    assert!(
        control.is_empty(),
        "the hash-mode control broke idle connections, so the testbed itself does:\n{}\n{table}",
        control.join("\n")
    );
    let violations = cheetah.violations();
    assert!(
        violations.is_empty(),
        "idle connections through cheetah:\n{}\n{table}",
        violations.join("\n")
    );
}

/// One kind of connection, from its own client namespace so its PAWS counter is its own.
#[derive(Clone, Debug)]
struct Workload {
    /// `c<client>`.
    client: usize,
    gap_secs: u64,
    sessions: usize,
    path: &'static str,
    load_secs: u64,
    /// nginx closes these connections while they idle (the FIN check).
    server_closes: bool,
}

impl Workload {
    fn all() -> Vec<Workload> {
        let mut all = vec![Workload {
            client: 0,
            gap_secs: FIN_GAP_SECS,
            sessions: FIN_SESSIONS,
            path: NGINX_DEFAULT_TIMEOUT_PATH,
            load_secs: FIN_GAP_SECS + 10,
            server_closes: true,
        }];
        all.extend(GAPS_SECS.iter().enumerate().map(|(i, &gap_secs)| Workload {
            client: i + 1,
            gap_secs,
            sessions: SESSIONS_PER_GAP,
            path: "/small",
            load_secs: LOAD_SECS,
            server_closes: false,
        }));
        all
    }

    /// Requests each session makes: one at its start (within a second of the load's), then
    /// one per gap while the load runs.
    fn requests_per_session(&self) -> u64 {
        if self.server_closes {
            return 1;
        }
        (self.load_secs - 1) / self.gap_secs + 1
    }

    fn label(&self) -> String {
        if self.server_closes {
            format!("{} s, nginx closes at 75 s", self.gap_secs)
        } else {
            format!("{} s", self.gap_secs)
        }
    }
}

/// A testbed with its LB, server captures and one loadgen per workload, running.
struct IdleRun {
    mode: &'static str,
    loads: Vec<(Workload, Loadgen)>,
    captures: Vec<Capture>,
    paws_before: Vec<u64>,
    lb: Lb,
    // Last, so that it is dropped (torn down) after everything running in it.
    testbed: Testbed,
}

impl IdleRun {
    fn start(prefix: &str, mode: &'static str) -> Self {
        let workloads = Workload::all();
        let clients = (workloads.len() - 1).to_string();
        let testbed = Testbed::up(
            prefix,
            &[
                "--servers",
                "2",
                "--clients",
                &clients,
                "--mode",
                mode,
                "--policy",
                "rr",
            ],
        );
        let lb = Lb::start(&testbed, &testbed.config_path());
        let captures = ["s1", "s2"]
            .iter()
            .map(|s| {
                let path = testbed.dir.join(format!("{s}-idle.pcap"));
                Capture::start_with_snaplen(
                    &testbed.ns(s),
                    "eth0",
                    "tcp port 80",
                    &path,
                    Some(SNAPLEN),
                )
            })
            .collect();
        let paws_before = workloads
            .iter()
            .map(|w| paws_estab(&testbed, w.client))
            .collect();
        let loads = workloads
            .into_iter()
            .map(|w| {
                let args = [
                    "--duration".to_string(),
                    format!("{}s", w.load_secs),
                    "--keepalive".into(),
                    "0".into(),
                    "--short-rate".into(),
                    "0".into(),
                    "--idle-sessions".into(),
                    w.sessions.to_string(),
                    "--idle-gap".into(),
                    format!("{}s", w.gap_secs),
                    "--path".into(),
                    w.path.into(),
                    // A broken connection stays broken: every session is one connection.
                    "--reconnect".into(),
                    "false".into(),
                ];
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let name = format!("idle-c{}", w.client);
                let load = Loadgen::start(&testbed, &format!("c{}", w.client), &name, &args);
                (w, load)
            })
            .collect();
        IdleRun {
            mode,
            loads,
            captures,
            paws_before,
            lb,
            testbed,
        }
    }

    fn finish(self, deadline: Instant) -> Outcome {
        let IdleRun {
            mode,
            loads,
            captures,
            paws_before,
            lb,
            testbed,
        } = self;
        let reports: Vec<(Workload, Value)> = loads
            .into_iter()
            .map(|(w, load)| (w, load.finish_by(deadline)))
            .collect();
        let mut echoes = EchoCheck::default();
        for capture in captures {
            let segments = capture.segments();
            echoes.add_server_capture(&segments, 80);
        }
        let lb_drops = drops_by_reason(&lb.metrics());
        let rows = reports
            .into_iter()
            .zip(paws_before)
            .map(|((workload, report), before)| Row {
                paws_drops: paws_estab(&testbed, workload.client) - before,
                echoes: echoes.client(testbed.client_address(workload.client)),
                workload,
                report,
            })
            .collect();
        Outcome {
            mode,
            rows,
            lb_drops,
        }
    }
}

fn paws_estab(testbed: &Testbed, client: usize) -> u64 {
    netstat_counter(&testbed.ns(&format!("c{client}")), "TcpExt", "PAWSEstab")
        .expect("every kernel counts TcpExt:PAWSEstab")
}

struct Row {
    workload: Workload,
    report: Value,
    paws_drops: u64,
    echoes: EchoCounts,
}

struct Outcome {
    mode: &'static str,
    rows: Vec<Row>,
    lb_drops: BTreeMap<String, u64>,
}

impl Outcome {
    fn table(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(text, "idle connections through the {} LB:", self.mode);
        let _ = writeln!(
            text,
            "| gap | connections | requests (expected) | broken | PAWS drops | echoes after a gap: exact / wrong | all echoes wrong |"
        );
        let _ = writeln!(text, "|---|---:|---:|---|---:|---:|---:|");
        for row in &self.rows {
            let report = &row.report;
            let broken = count(&report["connections_broken"]);
            let kinds = if broken == 0 {
                "0".to_string()
            } else {
                format!("{broken} {}", report["broken_by_kind"])
            };
            let _ = writeln!(
                text,
                "| {} | {} | {} ({}) | {kinds} | {} | {} / {} | {} |",
                row.workload.label(),
                count(&report["connections_opened"]["idle"]),
                count(&report["requests"]["idle"]),
                row.workload.requests_per_session() * row.workload.sessions as u64,
                row.paws_drops,
                row.echoes.exact_after_gap,
                row.echoes.mismatches_after_gap,
                row.echoes.mismatches,
            );
        }
        let drops: Vec<String> = self
            .lb_drops
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        let _ = writeln!(
            text,
            "LB drops: {}\n",
            if drops.is_empty() {
                "none".to_string()
            } else {
                drops.join(", ")
            }
        );
        text
    }

    /// Everything that went wrong, one line each.
    fn violations(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        for row in &self.rows {
            let w = &row.workload;
            let report = &row.report;
            let what = format!("{} gap {}", self.mode, w.label());
            let sessions = w.sessions as u64;
            let opened = count(&report["connections_opened"]["idle"]);
            if opened != sessions {
                wrong.push(format!(
                    "{what}: {opened} connections opened for {sessions} sessions"
                ));
            }
            let requests = count(&report["requests"]["idle"]);
            let expected = w.requests_per_session() * sessions;
            if requests != expected {
                wrong.push(format!(
                    "{what}: {requests} requests answered of {expected}"
                ));
            }
            if w.server_closes {
                wrong.extend(fin_violations(&what, w, report));
            } else if count(&report["connections_broken"]) > 0 {
                wrong.push(format!("{what}: broken connections: {}", report["broken"]));
            }
            if row.paws_drops > 0 {
                wrong.push(format!(
                    "{what}: {} PAWS drops (TcpExtPAWSEstab) at client c{}",
                    row.paws_drops, w.client
                ));
            }
            let echoes = &row.echoes;
            if echoes.mismatches > 0 {
                wrong.push(format!(
                    "{what}: {} TSecr values a server never sent ({} after a gap), e.g. {:#?}",
                    echoes.mismatches, echoes.mismatches_after_gap, echoes.examples
                ));
            }
            if echoes.unknown_connections > 0 {
                wrong.push(format!(
                    "{what}: {} echoes on connections the captures did not see start",
                    echoes.unknown_connections
                ));
            }
            // Every gap ends with a request (or, for the FIN, the client's ACK of it).
            let gaps = sessions * (w.requests_per_session() - 1).max(1);
            let after_gap = echoes.exact_after_gap + echoes.mismatches_after_gap;
            if after_gap < gaps {
                wrong.push(format!(
                    "{what}: the servers saw {after_gap} client segments after an idle gap, \
                     fewer than the {gaps} gaps the sessions waited"
                ));
            }
        }
        wrong
    }
}

/// Every session's connection must end with nginx's FIN, seen by the client while it
/// waited (loadgen's `closed`), about 75 s after its request: not a RST or a timeout when
/// its next request finds the server's side gone.
fn fin_violations(what: &str, workload: &Workload, report: &Value) -> Vec<String> {
    let mut wrong = Vec::new();
    let broken = report["broken"].as_array().cloned().unwrap_or_default();
    let fins = broken
        .iter()
        .filter(|b| b["kind"] == "closed")
        .filter(|b| {
            // The request goes out within a second of the load's start.
            let t = b["t"].as_f64().unwrap_or(0.0);
            (NGINX_DEFAULT_TIMEOUT_SECS - 1.0..workload.gap_secs as f64).contains(&t)
        })
        .count();
    if fins != workload.sessions || broken.len() != workload.sessions {
        wrong.push(format!(
            "{what}: {fins} of {} connections saw nginx's FIN while idle; the client saw: {}",
            workload.sessions, report["broken"]
        ));
    }
    wrong
}

#[test]
fn sessions_make_one_request_per_gap_within_the_load() {
    let gap = |gap_secs| Workload {
        client: 1,
        gap_secs,
        sessions: 1,
        path: "/small",
        load_secs: LOAD_SECS,
        server_closes: false,
    };
    // 0, 70, ..., 490 s; 560 s is past the 540 s load.
    assert_eq!(gap(70).requests_per_session(), 8);
    assert_eq!(gap(200).requests_per_session(), 3);
    assert_eq!(gap(330).requests_per_session(), 2);
    assert_eq!(gap(LAYOUT_LIMIT_GAP_SECS).requests_per_session(), 2);
    // Each request is due at least 10 s before the load ends, though a session may start up
    // to a second late.
    for &gap_secs in &GAPS_SECS {
        let requests = gap(gap_secs).requests_per_session();
        assert!((requests - 1) * gap_secs + 1 + 10 <= LOAD_SECS);
        assert!(requests * gap_secs > LOAD_SECS);
    }
}

#[test]
fn echoes_are_checked_against_what_the_server_sent_and_gaps_are_found() {
    const CLIENT: [u8; 4] = [10, 10, 11, 2];
    const SERVER: [u8; 4] = [10, 99, 0, 1];
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    let segment = |from_client: bool, flags: u8, tsval: u32, tsecr: u32| {
        let (src, dst, sport, dport) = if from_client {
            (CLIENT, SERVER, 40000, 80)
        } else {
            (SERVER, CLIENT, 80, 40000)
        };
        TcpView {
            src,
            dst,
            sport,
            dport,
            seq: 0,
            ack: 0,
            flags,
            payload_len: 0,
            timestamps: Some((tsval, tsecr)),
        }
    };
    let segments = [
        segment(true, SYN, 1_000, 0),
        segment(false, SYN | ACK, 5_000, 1_000),
        segment(true, ACK, 1_001, 5_000),
        segment(false, ACK, 5_010, 1_001),
        // 70 s later the client echoes the server's last TSval: exact, after a gap.
        segment(true, ACK, 71_001, 5_010),
        // A TSecr the server never sent (a cookie left in place).
        segment(true, ACK, 71_002, 0x8123_5010),
        // An echo after a gap that the server never sent.
        segment(true, ACK, 150_000, 0x8123_5010),
    ];
    let mut check = EchoCheck::default();
    check.add_server_capture(&segments, 80);
    let counts = check.client(Ipv4Addr::from(CLIENT));
    assert_eq!(counts.exact, 2);
    assert_eq!(counts.exact_after_gap, 1);
    assert_eq!(counts.mismatches, 2);
    assert_eq!(counts.mismatches_after_gap, 1);
    assert_eq!(counts.unknown_connections, 0);
}
