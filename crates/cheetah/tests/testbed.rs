//! End-to-end test of `cheetah testbed`, through the built binary and the real system:
//! namespaces, veths, nginx. Needs root; without it the test says so loudly and passes.
//!
//! Names and addresses are read from the `testbed.json` that `up` writes, the way the LB's
//! end-to-end tests are meant to read them.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "shared/programs.rs"]
mod programs;
use programs::{cheetah, cheetah_ok, in_netns_ok, is_root};

const PREFIX: &str = "tb";

fn namespaces_of(prefix: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("cannot run ip netns list");
    let own = format!("{prefix}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&own))
        .map(str::to_string)
        .collect()
}

fn nginx_pids(namespace: &str) -> Vec<i32> {
    let out = Command::new("ip")
        .args(["netns", "pids", namespace])
        .output()
        .expect("cannot run ip netns pids");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "nginx")
        })
        .collect()
}

/// A zombie counts as gone: init reaps the daemonized nginx masters in its own time.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            != Some("Z")
    })
}

fn read_summary(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("testbed.json is JSON")
}

fn text<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what} is not a string in testbed.json: {value}"))
}

/// Brings the testbed down however the test ends, so a failed assertion leaves nothing.
struct Teardown;

impl Drop for Teardown {
    fn drop(&mut self) {
        let out = cheetah(&["testbed", "down", "--prefix", PREFIX]);
        if !out.status.success() {
            eprintln!(
                "cleanup `cheetah testbed down --prefix {PREFIX}` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn testbed_comes_up_serves_and_goes_down_without_a_trace() {
    if !is_root() {
        // Straight to stderr: the test harness swallows eprintln! of a passing test.
        let _ = writeln!(
            std::io::stderr(),
            "\n########################################################################\n\
             ## SKIPPED testbed_comes_up_serves_and_goes_down_without_a_trace:      ##\n\
             ## it needs root to create network namespaces. Run the tests as root. ##\n\
             ########################################################################\n"
        );
        return;
    }
    let _teardown = Teardown;
    let up = cheetah_ok(&["testbed", "up", "--prefix", PREFIX, "--servers", "2"]);
    assert!(up.contains("testbed tb is up"), "{up}");

    let summary_path = PathBuf::from("/run/cheetah-testbed/tb/testbed.json");
    let summary = read_summary(&summary_path);
    assert_eq!(
        text(&summary["files"]["summary"], "files.summary"),
        summary_path.to_str().unwrap()
    );

    let mut expected: Vec<String> = ["lb", "rt", "sw", "s1", "s2", "c0", "c1", "c2", "c3"]
        .iter()
        .map(|role| format!("{PREFIX}-{role}"))
        .collect();
    expected.sort();
    let mut existing = namespaces_of(PREFIX);
    existing.sort();
    assert_eq!(existing, expected);

    // The LB's config names both servers with the MACs the servers really have.
    let config =
        std::fs::read_to_string(text(&summary["files"]["config"], "files.config")).unwrap();
    let servers = summary["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 2);
    for server in servers {
        let namespace = text(&server["namespace"], "namespace");
        let mac = text(&server["mac"], "mac");
        assert!(config.contains(&format!("mac = \"{mac}\"")), "{config}");
        let link = in_netns_ok(namespace, "cat", &["/sys/class/net/eth0/address"]);
        assert_eq!(link.trim(), mac);
    }
    // The key, and the cookie layout the LB's config asks for (the default).
    let key = cheetah_daemon::config::read_key_file(std::path::Path::new(text(
        &summary["files"]["secret"],
        "files.secret",
    )))
    .unwrap();
    assert_eq!(key.cookie_epoch_bits, Some(4));

    // s1 serves locally, and every answer names it.
    let s1 = &servers[0];
    let s1_ns = text(&s1["namespace"], "namespace");
    let small_url = format!("http://{}/small", text(&s1["dip"], "dip"));
    let response = in_netns_ok(s1_ns, "curl", &["-s", "-D-", "-o", "/dev/null", &small_url]);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("X-Server: s1\r\n"), "{response}");
    let missing = format!("http://{}/missing", text(&s1["dip"], "dip"));
    let response = in_netns_ok(s1_ns, "curl", &["-s", "-D-", "-o", "/dev/null", &missing]);
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    assert!(
        response.contains("X-Server: s1\r\n"),
        "errors name the server too: {response}"
    );

    let slow_url = format!("http://{}/slow", text(&s1["dip"], "dip"));
    let started = Instant::now();
    in_netns_ok(s1_ns, "curl", &["-sf", "-o", "/dev/null", &slow_url]);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "/slow answered after {waited:?}"
    );

    let timestamps = in_netns_ok(s1_ns, "sysctl", &["-n", "net.ipv4.tcp_timestamps"]);
    assert_eq!(timestamps.trim(), "2");
    let vip_on_lo = in_netns_ok(s1_ns, "ip", &["-4", "addr", "show", "dev", "lo"]);
    assert!(
        vip_on_lo.contains("10.99.0.1/32"),
        "l2 puts the VIP on lo: {vip_on_lo}"
    );

    let lb_ns = text(&summary["lb"]["namespace"], "lb.namespace");
    for interface in ["lb-c", "lb-s", "lb-l"] {
        let queues = in_netns_ok(
            lb_ns,
            "ls",
            &[&format!("/sys/class/net/{interface}/queues")],
        );
        let mut queues: Vec<&str> = queues.split_whitespace().collect();
        queues.sort();
        assert_eq!(queues, ["rx-0", "rx-1", "tx-0", "tx-1"], "{interface}");
    }
    // The LB host is no router: whatever the host's own ip_forward, which new namespaces
    // inherit, nothing arriving at the LB for a server's address is forwarded.
    for conf in ["all", "default", "lb-c", "lb-s", "lb-l"] {
        let path = format!("/proc/sys/net/ipv4/conf/{conf}/forwarding");
        let value = in_netns_ok(lb_ns, "cat", &[&path]);
        assert_eq!(value.trim(), "0", "{path} in the LB's namespace");
    }

    // c1 reaches the LB through the router.
    let c1 = &summary["clients"][1];
    assert_eq!(text(&c1["name"], "name"), "c1");
    in_netns_ok(
        text(&c1["namespace"], "namespace"),
        "ping",
        &["-c", "1", "-W", "2", "10.10.1.2"],
    );

    let status = cheetah_ok(&["testbed", "status", "--prefix", PREFIX]);
    assert!(status.contains("nginx: running"), "{status}");
    assert!(!status.contains("NOT running"), "{status}");
    assert!(
        status.contains("/run/cheetah-testbed/tb/cheetah.toml"),
        "{status}"
    );

    // A second `up` replaces the first: the old servers are gone, the new ones use NAT.
    let old_pids: Vec<i32> = ["tb-s1", "tb-s2"]
        .iter()
        .flat_map(|ns| nginx_pids(ns))
        .collect();
    assert!(!old_pids.is_empty());
    cheetah_ok(&[
        "testbed",
        "up",
        "--prefix",
        PREFIX,
        "--servers",
        "2",
        "--clients",
        "1",
        "--forwarding",
        "nat",
    ]);
    assert!(
        old_pids.iter().all(|&pid| !alive(pid)),
        "nginx of the first up survived"
    );
    assert!(!namespaces_of(PREFIX).contains(&"tb-c3".to_string()));
    let lo = in_netns_ok("tb-s1", "ip", &["-4", "addr", "show", "dev", "lo"]);
    assert!(
        !lo.contains("10.99.0.1"),
        "nat keeps the VIP off the servers: {lo}"
    );
    let config = std::fs::read_to_string("/run/cheetah-testbed/tb/cheetah.toml").unwrap();
    assert!(config.contains("forwarding = \"nat\""), "{config}");

    let pids: Vec<i32> = ["tb-s1", "tb-s2"]
        .iter()
        .flat_map(|ns| nginx_pids(ns))
        .collect();
    assert!(!pids.is_empty());
    cheetah_ok(&["testbed", "down", "--prefix", PREFIX]);
    assert_eq!(namespaces_of(PREFIX), Vec::<String>::new());
    assert!(pids.iter().all(|&pid| !alive(pid)), "nginx survived down");
    assert!(!summary_path.exists(), "down removes the state dir");
    // And once more, with nothing there.
    cheetah_ok(&["testbed", "down", "--prefix", PREFIX]);
}
