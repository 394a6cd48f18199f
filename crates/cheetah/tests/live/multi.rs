//! Live: several LB instances behind the router's ECMP route (`cheetah testbed up --lbs 2`),
//! each running `cheetah run` with the same config and key, the servers' replies crossing
//! either instance (their default route is ECMP over both).
//!
//! - From a cold start, instances that joined the router's pool once ready (`cheetah
//!   testbed lb join` waits for `GET /ready`) answer every request at once, in l2 and nat:
//!   an instance that had not learnt a server's clock would drop the client's packets
//!   (`ts_msb_unknown`) and the client would wait for a retransmission.
//! - A server added to both instances serves its first requests at once, also while it is
//!   active on one of them and draining on the other.
//! - An instance leaving and rejoining the pool under load breaks nothing, and while one
//!   is out of the pool it still forwards replies: they cross instances.
//! - The churn scenario with two instances, restarted one at a time: 0 broken in cheetah
//!   mode, many in hash mode.

use std::time::Duration;

use crate::support::*;

/// Time a request may take: a dropped packet costs the client a retransmission (1 s for a
/// SYN, 200 ms and more for data), so a request this slow lost one.
const SLOW_SECS: f64 = 0.5;
/// New connections per check; the router's L4 hash spreads them over both instances.
const REQUESTS: usize = 30;
/// The added server's first connections that must be answered at once...
const ADDED_SERVER_FIRST: usize = 6;
/// ...within this many new connections (rr over three servers gives it a third of an
/// instance's; with one instance choosing it, a sixth of all).
const ADDED_SERVER_TRIES: usize = 120;

live_tests! {
    fn l2_two_instances_answer_every_request_at_once_from_a_cold_start() {
        cold_start("l2", "mi");
    }
    fn nat_two_instances_answer_every_request_at_once_from_a_cold_start() {
        cold_start("nat", "mj");
    }
    fn l2_a_server_added_to_both_instances_serves_at_once() {
        server_added("l2", "mk");
    }
    fn nat_a_server_added_to_both_instances_serves_at_once() {
        server_added("nat", "mo");
    }
    fn an_instance_leaving_and_rejoining_the_pool_under_load_breaks_nothing() {
        leave_and_rejoin("ml");
    }
    fn two_instances_break_no_connection_through_the_churn_scenario() {
        churn_cheetah("mm");
    }
    fn hashing_with_two_instances_breaks_connections_in_the_same_scenario() {
        churn_hash("mn");
    }
}

fn two_instances(prefix: &str, forwarding: &str, clients: &str) -> Testbed {
    Testbed::up(
        prefix,
        &[
            "--lbs",
            "2",
            "--servers",
            "3",
            "--clients",
            clients,
            "--forwarding",
            forwarding,
            "--policy",
            "rr",
        ],
    )
}

/// One request on a new connection from c1, which must be answered 200 within
/// `SLOW_SECS`; the server that answered. A failure shows each instance's drops.
fn answered_at_once(testbed: &Testbed, instances: &Instances, what: &str) -> String {
    let (status, server, seconds) = timed_request(testbed, "c1");
    if status != "200" || seconds >= SLOW_SECS {
        let drops: Vec<_> = instances
            .lbs
            .iter()
            .map(|lb| {
                let mut drops = drops_by_reason(&lb.metrics());
                drops.retain(|_, count| *count > 0);
                drops
            })
            .collect();
        panic!(
            "{what}: status {status} after {seconds:.3} s from {server:?} (000: no answer in 5 s); drops by instance: {drops:?}"
        );
    }
    server
}

/// `REQUESTS` new connections from c1, each answered at once; how many each server served.
fn every_request_answered_at_once(
    testbed: &Testbed,
    instances: &Instances,
    what: &str,
) -> std::collections::BTreeMap<String, usize> {
    let mut served = std::collections::BTreeMap::new();
    for n in 0..REQUESTS {
        let server = answered_at_once(testbed, instances, &format!("{what}, request {n}"));
        *served.entry(server).or_insert(0) += 1;
    }
    served
}

/// Neither instance dropped a client's packet for want of the server's clock.
fn assert_no_unknown_clock(instances: &Instances, what: &str) {
    for (k, lb) in (1..).zip(&instances.lbs) {
        let drops = drops_by_reason(&lb.metrics());
        assert_eq!(
            drops.get("ts_msb_unknown").copied().unwrap_or(0),
            0,
            "{what}: instance {k} did not know a server's clock: {drops:?}"
        );
    }
}

fn cold_start(forwarding: &str, prefix: &str) {
    let testbed = two_instances(prefix, forwarding, "1");
    let instances = Instances::start(&testbed, &testbed.config_path());
    instances.join_all();
    let what = format!("{forwarding}, cold start");
    let served = every_request_answered_at_once(&testbed, &instances, &what);
    assert_eq!(
        served.len(),
        3,
        "{what}: rr over 3 servers served {served:?}"
    );
    // The kernel's counts reach the metrics once a second.
    let spread = eventually(Duration::from_secs(3), || {
        instances
            .event_counts("new_connections")
            .iter()
            .all(|&n| n > 0.0)
    });
    let new_connections = instances.event_counts("new_connections");
    assert!(
        spread,
        "{what}: the router's ECMP did not spread connections over both instances: {new_connections:?}"
    );
    assert_no_unknown_clock(&instances, &what);
}

/// A server added to two instances as docs/operations.md has it: draining on both first,
/// then activated on instance 1, then on instance 2. While only instance 1 sends it
/// connections, its replies cross both instances, and instance 2 must forward them: had it
/// not known the server, it would drop them (l2: `unknown_server_source`; nat: not even a
/// reply) and each client would wait 1 s for a retransmitted SYN.
fn server_added(forwarding: &str, prefix: &str) {
    let testbed = two_instances(prefix, forwarding, "1");
    let config = testbed.config_with_pool(&[1, 2]);
    let instances = Instances::start(&testbed, &config);
    instances.join_all();
    let mut add = testbed.server_add_args(3);
    add.push("--draining".into());
    instances.ctl_all(&add.iter().map(String::as_str).collect::<Vec<_>>());
    instances.lb(1).ctl_ok(&["servers", "activate", "3"]);
    first_served_at_once(&testbed, &instances, "s3 active on instance 1");
    instances.lb(2).ctl_ok(&["servers", "activate", "3"]);
    first_served_at_once(&testbed, &instances, "s3 active on both");
    assert_no_unknown_clock(&instances, "s3 added");
}

/// New connections, each answered at once, until s3 has served `ADDED_SERVER_FIRST` of
/// them; however soon the instances start choosing it (they may wait for its first
/// health probe).
fn first_served_at_once(testbed: &Testbed, instances: &Instances, what: &str) {
    let mut by_s3 = 0;
    let mut served = std::collections::BTreeMap::new();
    for n in 0..ADDED_SERVER_TRIES {
        let server = answered_at_once(testbed, instances, &format!("{what}, request {n}"));
        by_s3 += usize::from(server == "s3");
        *served.entry(server).or_insert(0) += 1;
        if by_s3 == ADDED_SERVER_FIRST {
            return;
        }
    }
    panic!(
        "{what}: s3 was chosen {by_s3} times in {ADDED_SERVER_TRIES} new connections: {served:?}"
    );
}

/// While instance `k` is out of the router's pool, it takes no client packet, yet forwards
/// replies: the servers' ECMP route sends replies through it whichever instance took the
/// connection's client side. Returns the replies it forwarded meanwhile.
fn replies_while_out(instances: &Instances, k: usize) -> f64 {
    instances.leave(k);
    // Let what the router had already sent it drain.
    std::thread::sleep(Duration::from_secs(1));
    let lb = instances.lb(k);
    let (to_server, to_client) = (lb.event_count("to_server"), lb.event_count("to_client"));
    std::thread::sleep(Duration::from_secs(4));
    let took = lb.event_count("to_server") - to_server;
    let replies = lb.event_count("to_client") - to_client;
    assert_eq!(
        took, 0.0,
        "instance {k} took client packets while out of the router's pool"
    );
    assert!(
        replies > 0.0,
        "instance {k}, out of the pool, forwarded no reply: replies did not cross instances"
    );
    instances.join(k);
    replies
}

fn leave_and_rejoin(prefix: &str) {
    let testbed = two_instances(prefix, "l2", "1");
    let instances = Instances::start(&testbed, &testbed.config_path());
    instances.join_all();
    let load = Loadgen::start_until_finished(
        &testbed,
        "c1",
        "multi-load",
        &["--keepalive", "32", "--short-rate", "20/s"],
    );
    std::thread::sleep(Duration::from_secs(3));
    let mut crossed = Vec::new();
    for k in [2, 1] {
        crossed.push(replies_while_out(&instances, k));
        std::thread::sleep(Duration::from_secs(2));
    }
    let report = load.finish();
    eprintln!("replies forwarded by instance 2, then 1, while out of the pool: {crossed:?}");
    assert_nothing_broken(&report, "instances leaving and rejoining the pool");
    let keepalive = count(&report["requests"]["keepalive"]);
    assert!(
        keepalive > 32 * 10,
        "the keep-alive sessions made only {keepalive} requests: {}",
        report["requests"]
    );
    let took = instances.event_counts("to_server");
    assert!(
        took.iter().all(|&n| n > 0.0),
        "both instances took client packets: {took:?}"
    );
}

/// The churn scenario, shortened (every step of its schedule, at 60 s instead of 150 s:
/// the restarts are what two instances change) and without the sessions idle longer than
/// one MSB period, which the one-instance churn test covers.
fn churn_cheetah(prefix: &str) {
    let out = tempfile::tempdir().unwrap();
    let results = Churn::start_with_lbs(
        "cheetah",
        2,
        prefix,
        out.path(),
        &["--duration", "60s", "--long-idle-sessions", "0"],
    )
    .finish();
    assert_eq!(results["lbs"], 2, "{}", results["lbs"]);
    assert_eq!(
        count(&results["connections_broken"]),
        0,
        "two cheetah instances broke connections: {}",
        serde_json::to_string_pretty(&results["broken"]).unwrap()
    );
    let restarts = results["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "restart")
        .count();
    assert_eq!(restarts, 2, "{}", results["events"]);
    assert!(count(&results["requests"]["total"]) > 1000);
    assert_eq!(
        count(&results["long_lived_at_end"]),
        count(&results["workload"]["keepalive"])
            + count(&results["workload"]["idle_sessions"])
            + count(&results["workload"]["downloads"]),
        "long-lived sessions did not all live to the end"
    );
}

fn churn_hash(prefix: &str) {
    let out = tempfile::tempdir().unwrap();
    let results = Churn::start_with_lbs(
        "hash",
        2,
        prefix,
        out.path(),
        &["--duration", "40s", "--long-idle-sessions", "0"],
    )
    .finish();
    let broken = count(&results["connections_broken"]);
    assert!(
        broken >= 50,
        "hashing with two instances broke only {broken} connections under the same churn"
    );
}
