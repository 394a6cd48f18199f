//! Live test: `cheetah run` must not turn the LB host into a router to the servers
//! (issue #19, part 6).
//!
//! The LB's namespace starts with IPv4 forwarding off, as on a host that is not a router,
//! and the router gets a route to the servers' segment through the LB, so that the LB
//! host's own forwarding is what the test exercises (c0, on the LB's own segment, already
//! routes everything through it). Then, in l2 and in nat:
//! - before the LB starts, no client reaches a server's own address (DIP);
//! - with the LB running, requests to the VIP succeed from both clients, which also shows
//!   that server replies find their next hop (the XDP program's FIB lookup) with
//!   forwarding off on every one of the LB's interfaces, while a TCP connection to
//!   DIP:80 and a ping to the DIP still fail;
//! - forwarding is on for `lo` only while the LB runs, and after a SIGTERM every
//!   forwarding sysctl of the namespace is what it was;
//! - (l2) forwarding an operator turned on is left on, and the start log says what it
//!   exposes.

use std::collections::BTreeMap;

use crate::support::*;

live_tests! {
    fn l2_lb_host_routes_nothing_to_the_servers() {
        scenario("l2", "fwl");
    }
    fn nat_lb_host_routes_nothing_to_the_servers() {
        scenario("nat", "fwn");
    }
}

const CLIENTS: [&str; 2] = ["c0", "c1"];
/// Where the testbed puts the servers (`lb-s`'s segment) and the LB's address toward the
/// router (`lb-c`).
const SERVER_NET: &str = "10.20.0.0/24";
const LB_CLIENT_SIDE: &str = "10.10.1.2";

fn scenario(forwarding: &str, prefix: &str) {
    let testbed = Testbed::up(
        prefix,
        &[
            "--servers",
            "2",
            "--clients",
            "1",
            "--forwarding",
            forwarding,
        ],
    );
    let lb_ns = testbed.ns("lb");
    // Whatever the testbed did, the LB host starts as a host that is not a router.
    set_sysctl(&lb_ns, "net.ipv4.conf.all.forwarding", "0");
    in_netns_ok(
        &testbed.ns("rt"),
        "ip",
        &["route", "add", SERVER_NET, "via", LB_CLIENT_SIDE],
    );
    let dips: Vec<String> = testbed
        .server_ids()
        .into_iter()
        .map(|id| testbed.server(id).0)
        .collect();
    let before = forwarding_sysctls(&lb_ns);
    assert!(
        before.values().all(|v| v == "0"),
        "forwarding should be off everywhere: {before:?}"
    );
    dip_unreachable(&testbed, &dips[0], "before the LB started");

    let mut lb = Lb::start(&testbed, &testbed.config_path());
    for client in CLIENTS {
        for _ in 0..4 {
            let status = curl_status(&testbed, client, &format!("http://{}/small", testbed.vip()));
            assert_eq!(
                status, "200",
                "{forwarding}: a request from {client} to the VIP failed with the LB running"
            );
        }
    }
    for dip in &dips {
        dip_unreachable(&testbed, dip, "with the LB running");
    }
    let running = forwarding_sysctls(&lb_ns);
    assert_eq!(
        running["lo"], "1",
        "{forwarding}: the XDP program's FIB lookups name lo, which needs forwarding on"
    );
    for interface in ["all", "lb-c", "lb-s", "lb-l"] {
        assert_eq!(
            running[interface], "0",
            "{forwarding}: the LB turned forwarding on for {interface}: {running:?}"
        );
    }
    lb.stop();
    assert_eq!(
        forwarding_sysctls(&lb_ns),
        before,
        "{forwarding}: the forwarding sysctls after the LB stopped are not what they were"
    );
    let log = std::fs::read_to_string(lb.log.with_extension("1.log")).unwrap_or_default();
    eprintln!("{forwarding}: the LB's log:\n{log}");
    assert!(
        log.contains("the host forwards on none of the LB's interfaces"),
        "{forwarding}: the start log does not say whether the host forwards:\n{log}"
    );

    if forwarding == "l2" {
        operator_forwarding_is_left_alone(&testbed, &mut lb, &dips);
    }
}

/// An operator who made the LB host a router on purpose keeps it: the LB says what that
/// exposes and turns nothing off.
fn operator_forwarding_is_left_alone(testbed: &Testbed, lb: &mut Lb, dips: &[String]) {
    let lb_ns = testbed.ns("lb");
    for interface in ["lb-c", "lb-s"] {
        set_sysctl(
            &lb_ns,
            &format!("net.ipv4.conf.{interface}.forwarding"),
            "1",
        );
    }
    let before = forwarding_sysctls(&lb_ns);
    lb.restart();
    let status = curl_status(testbed, "c1", &format!("http://{}/small", dips[0]));
    assert_eq!(
        status, "200",
        "the operator's own routing stopped working with the LB running"
    );
    lb.stop();
    assert_eq!(forwarding_sysctls(&lb_ns), before);
    let log = std::fs::read_to_string(lb.log.with_extension("2.log")).unwrap_or_default();
    eprintln!("l2, forwarding on for lb-c and lb-s: the LB's log:\n{log}");
    assert!(
        log.contains("IPv4 forwarding is on for lb-c, lb-s"),
        "the start log does not warn about the host's forwarding:\n{log}"
    );
}

/// Neither client gets a TCP connection to `dip`:80 nor an answer to a ping.
fn dip_unreachable(testbed: &Testbed, dip: &str, when: &str) {
    let url = format!("http://{dip}/small");
    for client in CLIENTS {
        let status = curl_status_quick(testbed, client, &url);
        assert_eq!(
            status, "000",
            "{when}: {client} reached server {dip} directly through the LB host (HTTP {status})"
        );
        let ping = in_netns(
            &testbed.ns(client),
            "ping",
            &["-c", "1", "-W", "1", "-q", dip],
        );
        assert!(
            !ping.status.success(),
            "{when}: {client}'s ping reached server {dip} through the LB host"
        );
    }
}

/// The HTTP status of one `curl` from `client`, `000` when no connection was made.
fn curl_status(testbed: &Testbed, client: &str, url: &str) -> String {
    http_code(testbed, client, url, &["-m", "10"])
}

/// Like [`curl_status`], giving up on the connection after a second: on the veths an open
/// path connects in well under a millisecond.
fn curl_status_quick(testbed: &Testbed, client: &str, url: &str) -> String {
    http_code(testbed, client, url, &["--connect-timeout", "1", "-m", "3"])
}

fn http_code(testbed: &Testbed, client: &str, url: &str, timeouts: &[&str]) -> String {
    curl_write_out(testbed, client, url, "%{http_code}", timeouts).concat()
}

/// `net.ipv4.conf.*.forwarding` of every interface of a namespace, and of `all` and
/// `default`.
fn forwarding_sysctls(namespace: &str) -> BTreeMap<String, String> {
    let out = in_netns_ok(
        namespace,
        "sh",
        &[
            "-c",
            "for f in /proc/sys/net/ipv4/conf/*/forwarding; do echo \"$f $(cat $f)\"; done",
        ],
    );
    out.lines()
        .filter_map(|line| {
            let (path, value) = line.split_once(' ')?;
            let interface = path.split('/').nth_back(1)?;
            Some((interface.to_string(), value.to_string()))
        })
        .collect()
}
