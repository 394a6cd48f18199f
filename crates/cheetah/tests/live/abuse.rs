//! Live abuse tests: what a client without the key, a broken sender and a careless
//! operator can do to a running LB, while real keep-alive connections go on through it.
//!
//! - forged cookies: random TSecr values from a client are dropped when they name no
//!   server, and reach the servers evenly when they do;
//! - malformed packets are dropped and counted, each under its own reason;
//! - bad API calls and bad configs are refused with a message naming the problem, and
//!   change nothing: the tables, the XDP program and the forwarding stay as they were.
//!
//! Frames are sent with `cheetah testbed inject` (docs/abuse.md). The loads run in `c1`,
//! behind the router; the injector in `c0`, on the LB's own segment, because the router's
//! IP layer would drop malformed IPv4 headers before they reached the LB.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::stats::{chi_squared, chi_squared_sf, ln_gamma, monte_carlo_p_value};
use crate::support::*;
use cheetah_core::cookie::{tcp_ts, CookieLayout};
use cheetah_core::hash::{FlowHasher, FlowKey};
use cheetah_lab::crafted::forged_acks;
use serde_json::Value;

/// Server ids a cookie can name in the testbed's (default) layout: 12 bits.
const ID_SPACE: u64 = CookieLayout::DEFAULT.server_ids() as u64;
/// Below this p-value a goodness-of-fit test fails. The secret is new in every testbed, so
/// each run is a fresh experiment: a correct LB fails one run in 10^4 per test.
const SIGNIFICANCE: f64 = 1e-4;

/// The keep-alive load every scenario runs beside the abuse: 32 long-lived connections with
/// a request a second each, and 10 short connections a second.
const LOAD: &[&str] = &["--keepalive", "32", "--short-rate", "10/s"];

/// A server outside every pool, added and removed so that adding it again is refused
/// (its id is quarantined).
const ADD_SERVER_99: [&str; 8] = [
    "servers",
    "add",
    "--id",
    "99",
    "--dip",
    "10.20.0.99",
    "--mac",
    "02:ce:00:00:02:63",
];

/// (c) Forged cookies, 10^5 of them, while a keep-alive load runs.
///
/// Every forged ACK comes from a random client port with a random TSecr. The LB decodes
/// the cookie as `(TSecr >> 16 XOR h(connection)) & 0xfff` (the default layout's 12 id
/// bits): with a keyed hash the client cannot predict, the id is uniform over the 4096 ids,
/// so S allocated ids catch S/4096 of the forged packets and the rest are dropped as
/// `cookie_unknown_server`.
///
/// Statistical design. With S = 4 servers, 10^5 cookies send N/4096 ≈ 24 packets to each
/// server. Allocating more ids does not help unless each is a real server that has sent
/// packets (an id whose timestamp clock the LB has never seen drops as `ts_msb_unknown`).
/// The claim is split in three, each tested soundly:
///
/// 1. Exactness, no statistics: the test knows the secret and the seed, so it decodes every
///    forged cookie itself (`CookieLayout::decode` with `FlowHasher`). The LB's
///    `cookie_unknown_server` count must equal the number decoding to unallocated ids, and
///    the packets captured at each server must be exactly those decoding to its id
///    (matched by port and sequence number), with the low 16 bits of TSecr untouched.
/// 2. Uniformity of the decoded ids over the whole id space, on all 10^5 cookies: a
///    chi-squared test over 64 bins of 64 ids (1562.5 expected per bin, 63 degrees of
///    freedom), so whichever S ids are allocated, each receives 1/4096 of the forged
///    traffic in expectation, and the unknown fraction is (4096 - S)/4096.
/// 3. The LB's own counts, cells {dropped, s1..s4} against the multinomial with those
///    probabilities: Pearson's statistic with a Monte Carlo p-value (10^5 simulated draws),
///    which does not lean on the chi-squared approximation for small cells. Its power is
///    against what matters: forged traffic piling onto one server.
///
/// Each server must have sent since the LB started (its MSB known) before the injection;
/// the load's first requests see to that, and `ts_msb_unknown` must not move.
#[test]
fn forged_cookies_are_dropped_or_spread_evenly_under_load() {
    let Some(_alone) = live_scenario("forged_cookies_are_dropped_or_spread_evenly_under_load")
    else {
        return;
    };
    let forged: u64 = std::env::var("CHEETAH_ABUSE_FORGED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    // The same frames in every run; the ids their cookies decode to still change from
    // run to run, with each testbed's new secret.
    let seed = 0x00c0_0c1e;
    let testbed = Testbed::up("abc", &["--servers", "4", "--clients", "1"]);
    let lb = Lb::start(&testbed, &testbed.config_path());
    let load = Loadgen::start_until_finished(&testbed, "c1", "forged-load", LOAD);
    let servers = testbed.server_ids();
    every_server_answered(&lb, &load, &servers);

    let injector = testbed.client_address(0);
    let captures: Vec<(u16, Capture)> = servers
        .iter()
        .map(|&id| {
            let path = testbed.dir.join(format!("s{id}-forged.pcap"));
            let filter = format!("tcp dst port 80 and src host {injector}");
            (
                id,
                Capture::start(&testbed.ns(&format!("s{id}")), "eth0", &filter, &path),
            )
        })
        .collect();
    let before = lb.metrics();
    let summary = inject(
        &testbed.ns("c0"),
        &[
            "--forged-cookies",
            &forged.to_string(),
            "--seed",
            &seed.to_string(),
            "--target",
            &testbed.vip(),
        ],
    );
    // The XDP program drops the cookies that route nowhere; its counts reach the metrics
    // within a second (the workers', for the AF_XDP path, at once).
    let expected = decode_forged(&testbed, injector, seed, forged, &servers);
    let counted = Instant::now();
    let drops = loop {
        std::thread::sleep(Duration::from_millis(500));
        let drops = deltas(&drops_by_reason(&before), &drops_by_reason(&lb.metrics()));
        let unknown = drops.get("cookie_unknown_server").copied().unwrap_or(0);
        if unknown >= expected.unknown || counted.elapsed() > Duration::from_secs(4) {
            break drops;
        }
    };
    let arrived: BTreeMap<u16, Vec<TcpView>> = captures
        .into_iter()
        .map(|(id, capture)| (id, capture.segments()))
        .collect();
    let report = load.finish();

    assert_eq!(summary["sent_total"].as_u64(), Some(forged), "{summary}");
    assert_eq!(
        summary["interface_tx_dropped"].as_u64(),
        Some(0),
        "{summary}"
    );

    // 1. Exactness.
    for (reason, &count) in &drops {
        let want = if reason == "cookie_unknown_server" {
            expected.unknown
        } else {
            0
        };
        assert_eq!(
            count, want,
            "drops for {reason}: {count}, expected {want} (all drops: {drops:?})"
        );
    }
    for &id in &servers {
        let mut got: Vec<(u16, u32, u16)> = arrived[&id]
            .iter()
            .map(|t| {
                let (_, tsecr) = t.timestamps.expect("a forged segment keeps its timestamp");
                (t.sport, t.seq, tsecr as u16)
            })
            .collect();
        got.sort_unstable();
        let want = &expected.by_server[&id];
        assert_eq!(
            &got, want,
            "server {id} received other forged segments than the cookies name"
        );
    }

    // 2. Uniformity of the decoded ids.
    let bins = 64;
    let mut per_bin = vec![0u64; bins];
    for id in &expected.ids {
        per_bin[*id as usize * bins / ID_SPACE as usize] += 1;
    }
    let uniform = vec![forged as f64 / bins as f64; bins];
    let id_statistic = chi_squared(&per_bin, &uniform);
    let id_p = chi_squared_sf(id_statistic, bins as u32 - 1);
    eprintln!(
        "decoded ids over {bins} bins: chi-squared {id_statistic:.1} (63 dof), p = {id_p:.3}"
    );
    assert!(
        id_p > SIGNIFICANCE,
        "the decoded ids are not uniform: {per_bin:?}"
    );

    // 3. The LB's counts: dropped, then each server.
    let reached: Vec<u64> = servers.iter().map(|id| arrived[id].len() as u64).collect();
    let mut observed = vec![drops["cookie_unknown_server"]];
    observed.extend(&reached);
    let per_id = 1.0 / ID_SPACE as f64;
    let mut probabilities = vec![1.0 - servers.len() as f64 * per_id];
    probabilities.extend(servers.iter().map(|_| per_id));
    let expected_counts: Vec<f64> = probabilities.iter().map(|p| p * forged as f64).collect();
    let statistic = chi_squared(&observed, &expected_counts);
    let p = monte_carlo_p_value(&observed, &probabilities, 100_000, 1);
    // Shown for comparison only: it is trustworthy once each server expects 5 or more.
    let asymptotic_p = chi_squared_sf(statistic, servers.len() as u32);
    eprintln!(
        "forged {forged}: dropped {} (expected {:.1}), per server {reached:?} (expected {:.2} each); \
         chi-squared {statistic:.2} ({} dof), Monte Carlo p = {p:.4} (chi-squared tail {asymptotic_p:.4})",
        observed[0],
        expected_counts[0],
        expected_counts[1],
        servers.len()
    );
    assert!(
        p > SIGNIFICANCE,
        "forged cookies are not spread evenly: {observed:?}"
    );

    assert_nothing_broken(&report, "forged cookies");
    keepalive_went_on(&report);
}

/// What the LB must do with each forged segment, from decoding its cookie with the key.
struct ForgedExpectation {
    /// The decoded id of every forged segment, in order.
    ids: Vec<u16>,
    /// Segments naming no allocated server.
    unknown: u64,
    /// Per server: (client port, sequence number, low 16 bits of TSecr), sorted.
    by_server: BTreeMap<u16, Vec<(u16, u32, u16)>>,
}

fn decode_forged(
    testbed: &Testbed,
    client: Ipv4Addr,
    seed: u64,
    count: u64,
    servers: &[u16],
) -> ForgedExpectation {
    let hasher = FlowHasher::new(&testbed.secret());
    let vip = testbed.vip_addr();
    let mut expectation = ForgedExpectation {
        ids: Vec::with_capacity(count as usize),
        unknown: 0,
        by_server: servers.iter().map(|&id| (id, Vec::new())).collect(),
    };
    for forged in forged_acks(seed).take(count as usize) {
        let key = FlowKey::tcp(
            u32::from(client),
            forged.client_port,
            u32::from(*vip.ip()),
            vip.port(),
        );
        let id = CookieLayout::DEFAULT
            .decode(tcp_ts::extract(forged.tsecr), hasher.hash(&key))
            .server
            .0;
        expectation.ids.push(id);
        match expectation.by_server.get_mut(&id) {
            Some(segments) => segments.push((forged.client_port, forged.seq, forged.tsecr as u16)),
            None => expectation.unknown += 1,
        }
    }
    for segments in expectation.by_server.values_mut() {
        segments.sort_unstable();
    }
    expectation
}

/// (d) Malformed packets, pings, UDP and stray ICMP errors to the VIP address, some behind
/// VLAN tags, are dropped in the XDP program and counted by reason while a keep-alive load
/// runs.
///
/// Every reason's counter must rise by exactly what was sent for it, and every other
/// reason must stay still: the load is Linux TCP to servers whose timestamp MSBs are known
/// (they answered before the injection), so it adds to no drop reason, and nothing else
/// sends to the VIP. A frame too short to hold an IPv4 header is the exception: the XDP
/// program cannot read its addresses and passes it to the LB host's kernel, which counts it
/// as `Ip: InHdrErrors`; the LB namespace carries no other IP traffic that could.
#[test]
fn malformed_packets_are_dropped_and_counted_by_reason_under_load() {
    let Some(_alone) =
        live_scenario("malformed_packets_are_dropped_and_counted_by_reason_under_load")
    else {
        return;
    };
    let testbed = Testbed::up("abd", &["--servers", "2", "--clients", "1"]);
    let lb = Lb::start(&testbed, &testbed.config_path());
    let load = Loadgen::start_until_finished(&testbed, "c1", "malformed-load", LOAD);
    every_server_answered(&lb, &load, &testbed.server_ids());

    let metrics_before = lb.metrics();
    let before = drops_by_reason(&metrics_before);
    let host_before = ip_snmp(lb.namespace());
    let summary = inject(
        &testbed.ns("c0"),
        &[
            "--malformed",
            "--count-each",
            "200",
            "--target",
            &testbed.vip(),
        ],
    );
    std::thread::sleep(Duration::from_secs(1));
    let metrics_after = lb.metrics();
    let drops = deltas(&before, &drops_by_reason(&metrics_after));
    let host_after = ip_snmp(lb.namespace());
    let outcomes = |metrics| counts_by_label(metrics, "cheetah_xdp_packets_total", "outcome");
    let xdp = deltas(&outcomes(&metrics_before), &outcomes(&metrics_after));
    let handed_up = handed_up_between(&metrics_before, &metrics_after);
    // A few more seconds of load after the injection, to see the connections survive it.
    std::thread::sleep(Duration::from_secs(2));
    let report = load.finish();

    assert_eq!(
        summary["interface_tx_dropped"].as_u64(),
        Some(0),
        "{summary}"
    );
    let mut expected_drops: BTreeMap<String, u64> = BTreeMap::new();
    let mut expected_host_errors = 0;
    for kind in summary["kinds"].as_array().unwrap() {
        let sent = kind["sent"].as_u64().unwrap();
        match kind["expected_drop_reason"].as_str() {
            Some(reason) => *expected_drops.entry(reason.to_string()).or_default() += sent,
            None => {
                assert_eq!(kind["expected_host_counter"], "Ip:InHdrErrors", "{kind}");
                expected_host_errors += sent;
            }
        }
    }
    let moved: BTreeMap<&String, &u64> = drops.iter().filter(|(_, &n)| n > 0).collect();
    eprintln!(
        "malformed: {} frames sent; drops that moved: {moved:?}",
        summary["sent_total"]
    );
    for (reason, &count) in &drops {
        let want = expected_drops.get(reason).copied().unwrap_or(0);
        assert_eq!(count, want, "drops for {reason}: {count}, expected {want}");
    }
    for reason in expected_drops.keys() {
        assert!(
            drops.contains_key(reason),
            "/metrics has no drop reason {reason}"
        );
    }
    let host_errors = host_after["InHdrErrors"] - host_before["InHdrErrors"];
    eprintln!("LB host kernel: Ip InHdrErrors +{host_errors}; XDP program: {xdp:?}");
    assert_eq!(host_errors, expected_host_errors);
    // The XDP program passes the host's own traffic too (ARP from the router and servers),
    // so `passed_to_host` rises by at least the truncated frames; none may find the LB's
    // sockets missing.
    assert!(xdp["passed_to_host"] >= expected_host_errors, "{xdp:?}");
    assert_eq!(xdp["no_socket"], 0, "{xdp:?}");
    // Every kind, tagged ones and pings included, is dropped in the kernel: a flood of
    // them costs no worker a packet. The load beside them (Linux TCP to an rr VIP) has
    // nothing to hand up either, so no reason may move.
    eprintln!("handed up to the workers meanwhile: {handed_up:?}");
    assert!(
        !handed_up.is_empty(),
        "/metrics has no cheetah_xdp_to_userspace_total"
    );
    assert!(
        handed_up.values().all(|&n| n == 0),
        "the XDP program handed frames up: {handed_up:?}"
    );

    assert_nothing_broken(&report, "malformed packets");
    keepalive_went_on(&report);
}

/// (f) Bad API calls and bad configs, while the LB forwards a keep-alive load: each is
/// refused with a message that names the field or the problem, and nothing changes. The
/// tables (`/servers` without its counters, `/vips`) and the snapshot generation stay the
/// same after every refused call, a second `cheetah run` leaves the running one's XDP
/// programs in place (same program ids), and no connection of the load breaks.
#[test]
fn bad_api_calls_and_configs_are_refused_and_change_nothing() {
    let Some(_alone) = live_scenario("bad_api_calls_and_configs_are_refused_and_change_nothing")
    else {
        return;
    };
    let testbed = Testbed::up("abf", &["--servers", "2", "--clients", "1"]);
    let mut lb = Lb::start(&testbed, &testbed.config_path());
    let load = Loadgen::start_until_finished(&testbed, "c1", "refusals-load", LOAD);
    every_server_answered(&lb, &load, &testbed.server_ids());

    // A removed id, to try reusing it: a server outside every pool, so no connection
    // depends on it.
    lb.ctl_ok(&ADD_SERVER_99);
    lb.ctl_ok(&["servers", "remove", "99"]);
    let xdp_before = xdp_programs(&testbed);
    assert_eq!(xdp_before.len(), 3, "the LB's XDP programs: {xdp_before:?}");

    refused_calls_change_nothing(&testbed, &lb);
    second_runs_fail_and_change_nothing(&testbed, &lb);

    assert_eq!(
        xdp_programs(&testbed),
        xdp_before,
        "the LB's XDP programs changed"
    );
    assert!(lb.is_running(), "the running LB exited");
    let report = load.finish();
    assert_nothing_broken(&report, "refused calls and configs");
    keepalive_went_on(&report);
}

fn refused_calls_change_nothing(testbed: &Testbed, lb: &Lb) {
    let vip = testbed.vip();
    let (_, server1_mac) = testbed.server(1);
    // (command line, what the message must say)
    let calls: Vec<(Vec<&str>, &str)> = vec![
        (vec!["servers", "drain", "77"], "server 77 does not exist"),
        (vec!["servers", "remove", "77"], "server 77 does not exist"),
        (
            vec!["weights", "set", &vip, "1=0"],
            "weights.1: weight must be at least 1",
        ),
        (
            vec!["weights", "set", &vip, "7=2"],
            "weights.7: server 7 is not in the pool",
        ),
        (
            vec!["weights", "set", &vip, "1:3"],
            "weights: `1:3` is not ID=WEIGHT",
        ),
        (
            vec!["policy", "set", &vip, "fastest"],
            "policy: unknown variant `fastest`",
        ),
        (
            vec!["policy", "set", &vip, "pow2", "--metric", "temperature"],
            "metric: unknown variant `temperature`",
        ),
        (
            vec!["policy", "set", "10.99.0.9:80", "rr"],
            "VIP 10.99.0.9:80 does not exist",
        ),
        (
            vec!["policy", "set", "10.99.0.1", "rr"],
            "vip: `10.99.0.1` is not address:port",
        ),
        (
            ADD_SERVER_99.to_vec(),
            "server id 99 was removed and is quarantined",
        ),
        (vec!["servers", "activate", "99"], "server 99 is removed"),
        (
            vec![
                "servers",
                "add",
                "--dip",
                "10.20.0.98",
                "--mac",
                &server1_mac,
            ],
            "have the same MAC",
        ),
        (
            vec![
                "servers",
                "add",
                "--id",
                "40000",
                "--dip",
                "10.20.0.98",
                "--mac",
                "02:ce:00:00:02:62",
            ],
            "id: 40000 is above 4095, the largest server id the cookie carries with cookie_epoch_bits = 4",
        ),
        (
            vec!["servers", "add", "--dip", "10.20.0.98"],
            "server.mac: l2 forwarding needs each server's MAC address",
        ),
        (
            vec![
                "servers",
                "add",
                "--dip",
                "10.99.0.1",
                "--mac",
                "02:ce:00:00:02:62",
            ],
            "dip: 10.99.0.1 is the address of VIP 10.99.0.1:80; a server needs an address of its own",
        ),
        (
            vec![
                "servers",
                "add",
                "--dip",
                "10.20.0.300",
                "--mac",
                "02:ce:00:00:02:62",
            ],
            "dip: invalid IP address syntax",
        ),
        (
            vec!["servers", "add", "--dip", "10.20.0.98", "--mac", "02:ce:zz"],
            "server.mac: `02:ce:zz` is not a MAC address",
        ),
        (
            vec!["pool", "join", &vip, "1"],
            "server 1 is already in the pool",
        ),
        (vec!["pool", "join", &vip, "55"], "server 55 does not exist"),
        (vec!["pool", "leave", &vip, "55"], "55"),
    ];
    let mut state = tables_and_generation(lb);
    for (args, message) in calls {
        let out = lb.ctl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "`ctl {}` was not refused: {stderr}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.starts_with("error: ") && stderr.contains(message),
            "`ctl {}` said {stderr:?}, not {message:?}",
            args.join(" ")
        );
        let now = tables_and_generation(lb);
        assert_eq!(now, state, "`ctl {}` changed the tables", args.join(" "));
        state = now;
    }
    // The wrong API address is a failure to reach, exit status 1, naming the address.
    let out = lb.ctl(&["--api", "127.0.0.1:9", "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not reachable at 127.0.0.1:9"));
}

/// `/servers` without the counters that the load moves, `/vips`, and the snapshot
/// generation, which every table change bumps.
fn tables_and_generation(lb: &Lb) -> Value {
    let mut servers: Value =
        serde_json::from_str(&lb.ctl_ok(&["--json", "servers", "list"])).unwrap();
    for server in servers["servers"].as_array_mut().unwrap() {
        let server = server.as_object_mut().unwrap();
        for volatile in [
            "active_connections",
            "new_connections",
            "packets",
            "bytes",
            "reported_load",
            "quarantine_left_secs",
            // The health probes' view moves by itself (`since_secs` every second).
            "health",
        ] {
            server.remove(volatile);
        }
    }
    let vips: Value = serde_json::from_str(&lb.ctl_ok(&["--json", "vips", "list"])).unwrap();
    let status: Value = serde_json::from_str(&lb.ctl_ok(&["--json", "status"])).unwrap();
    serde_json::json!({
        "servers": servers,
        "vips": vips,
        "snapshot_generation": status["snapshot_generation"],
    })
}

/// A second `cheetah run` beside the running one: with the same config (its API address is
/// taken) and with broken configs. Each exits non-zero naming the problem, before it
/// touches an interface.
fn second_runs_fail_and_change_nothing(testbed: &Testbed, lb: &Lb) {
    let config: toml::Table = std::fs::read_to_string(testbed.config_path())
        .unwrap()
        .parse()
        .unwrap();
    let variant = |name: &str, change: &dyn Fn(&mut toml::Table)| -> PathBuf {
        let mut broken = config.clone();
        change(&mut broken);
        let path = testbed.dir.join(format!("broken-{name}.toml"));
        std::fs::write(&path, toml::to_string(&broken).unwrap()).unwrap();
        path
    };
    // Past the API, state and pinned maps' checks, so that the interface is what fails.
    let own_api_and_state = |c: &mut toml::Table| {
        let daemon = c["daemon"].as_table_mut().unwrap();
        daemon.insert("api_listen".into(), "127.0.0.1:9181".into());
        daemon.insert("state_dir".into(), "state-broken".into());
        daemon.insert("bpf_pin_dir".into(), "/run/cheetah/bpf/abf-broken".into());
    };
    let runs: Vec<(PathBuf, Vec<&str>)> = vec![
        (
            testbed.config_path(),
            vec!["is in use by another running `cheetah run`"],
        ),
        (
            // Maps of its own, so that the busy API address is what fails.
            variant("busy-api", &|c| {
                let daemon = c["daemon"].as_table_mut().unwrap();
                daemon.insert("state_dir".into(), "state-busy-api".into());
                daemon.insert("bpf_pin_dir".into(), "/run/cheetah/bpf/abf-busy-api".into());
            }),
            vec![
                "cannot listen on 127.0.0.1:9180 for the control API",
                "Address already in use",
            ],
        ),
        (
            variant("unknown-field", &|c| {
                c.insert("colour".into(), "blue".into());
            }),
            vec!["is not valid", "unknown field `colour`"],
        ),
        (
            variant("missing-interface", &|c| {
                own_api_and_state(c);
                let daemon = c["daemon"].as_table_mut().unwrap();
                daemon["interfaces"]
                    .as_array_mut()
                    .unwrap()
                    .push("lb-nope".into());
            }),
            vec!["interface lb-nope does not exist in this network namespace"],
        ),
        (
            variant("bad-interface-name", &|c| {
                let daemon = c["daemon"].as_table_mut().unwrap();
                daemon["interfaces"].as_array_mut().unwrap()[1] = "lb-s-is-far-too-long".into();
            }),
            vec!["daemon.interfaces[1]: `lb-s-is-far-too-long` is not an interface name"],
        ),
        (
            variant("duplicate-id", &|c| {
                let servers = c["servers"].as_array_mut().unwrap();
                servers[1]
                    .as_table_mut()
                    .unwrap()
                    .insert("id".into(), 1.into());
            }),
            vec!["servers[1].id: server id 1 is used twice"],
        ),
        (
            variant("l2-without-mac", &|c| {
                let servers = c["servers"].as_array_mut().unwrap();
                servers[1].as_table_mut().unwrap().remove("mac");
            }),
            vec!["servers[1].mac: l2 forwarding needs each server's MAC address"],
        ),
        (
            variant("missing-secret", &|c| {
                c.insert("secret_file".into(), "no-such-secret".into());
            }),
            vec!["no-such-secret does not exist; pass --init-secret"],
        ),
    ];
    for (config, messages) in runs {
        let state = tables_and_generation(lb);
        let (code, stderr) = run_expecting_failure(lb.namespace(), &config);
        assert_ne!(code, Some(0), "{} was accepted", config.display());
        for message in messages {
            assert!(
                stderr.contains(message),
                "`cheetah run --config {}` said:\n{stderr}\nnot {message:?}",
                config.display()
            );
        }
        assert_eq!(
            tables_and_generation(lb),
            state,
            "{} changed the tables",
            config.display()
        );
    }
}

/// Runs `cheetah run --config CONFIG` in `namespace`, which must fail within 20 s (else it
/// is killed and the test fails: it would have been running beside the LB). Its exit code
/// and stderr.
fn run_expecting_failure(namespace: &str, config: &Path) -> (Option<i32>, String) {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", namespace, cheetah_bin(), "run", "--config"])
        .arg(config);
    exit_within(command, Duration::from_secs(20))
}

/// The XDP program id on each of the LB's interfaces (`prog/xdp id N` in `ip link`).
fn xdp_programs(testbed: &Testbed) -> BTreeMap<String, String> {
    let namespace = testbed.ns("lb");
    ["lb-c", "lb-s", "lb-l"]
        .iter()
        .filter_map(|interface| {
            let text = in_netns_ok(&namespace, "ip", &["link", "show", interface]);
            let id = text
                .split("prog/xdp id ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .to_string();
            Some((interface.to_string(), id))
        })
        .collect()
}

/// Waits until the load has reached every server in both directions, so each one's
/// timestamp MSB is known to the LB.
fn every_server_answered(lb: &Lb, load: &Loadgen, servers: &[u16]) {
    let packets = || metric_by_label(&lb.metrics(), "cheetah_server_packets_total", "server");
    let answered = eventually(Duration::from_secs(20), || {
        let packets = packets();
        servers
            .iter()
            .all(|id| packets.get(&id.to_string()).copied().unwrap_or(0.0) >= 20.0)
    });
    assert!(
        answered,
        "the load did not reach every server: packets by server {:?}\nloadgen:\n{}\nLB drops: {:?}",
        packets(),
        load.log(),
        drops_by_reason(&lb.metrics())
    );
    // A little more, so the keep-alive sessions are all open before the abuse starts.
    std::thread::sleep(Duration::from_secs(1));
}

fn keepalive_went_on(report: &Value) {
    let requests = count(&report["requests"]["keepalive"]);
    assert!(
        requests > 32,
        "the keep-alive load did not run: {}",
        report["requests"]
    );
}

// ---- the statistics themselves, checked against table values (no root needed) ----------

#[test]
fn chi_squared_tail_matches_tables() {
    // Critical values from standard tables: (x, dof, upper-tail probability).
    for (x, dof, p) in [
        (3.841_459, 1, 0.05),
        (6.634_897, 1, 0.01),
        (23.209_251, 10, 0.01),
        (82.528_727, 63, 0.05),
        (103.442_2, 63, 0.001),
        (0.351_846, 3, 0.95),
    ] {
        let got = chi_squared_sf(x, dof);
        assert!(
            (got - p).abs() < p * 1e-4,
            "sf({x}, {dof}) = {got}, tables say {p}"
        );
    }
    assert!((ln_gamma(10.0) - 362_880f64.ln()).abs() < 1e-12);
    assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
}

#[test]
fn monte_carlo_p_values_agree_with_the_chi_squared_tail_for_large_cells() {
    // 4 cells of 250 expected: the chi-squared approximation is good there.
    let observed = [270, 236, 251, 243];
    let probabilities = [0.25; 4];
    let expected = [250.0; 4];
    let asymptotic = chi_squared_sf(chi_squared(&observed, &expected), 3);
    let simulated = monte_carlo_p_value(&observed, &probabilities, 20_000, 3);
    assert!(
        (asymptotic - simulated).abs() < 0.02,
        "asymptotic {asymptotic}, simulated {simulated}"
    );
}

#[test]
fn monte_carlo_p_value_flags_forged_traffic_piled_on_one_server() {
    let per_id = 1.0 / ID_SPACE as f64;
    let probabilities = [1.0 - 4.0 * per_id, per_id, per_id, per_id, per_id];
    // 10^5 cookies, the 98 that reach servers (24.4 expected each) all on one.
    let piled = [99_902, 98, 0, 0, 0];
    assert!(monte_carlo_p_value(&piled, &probabilities, 100_000, 5) < SIGNIFICANCE);
    let even = [99_902, 25, 23, 26, 24];
    assert!(monte_carlo_p_value(&even, &probabilities, 100_000, 5) > 0.1);
}
