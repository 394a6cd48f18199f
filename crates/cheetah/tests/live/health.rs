//! Live: health checks and readiness, in l2 and in nat (testbeds `hcl`, `hcn`).
//!
//! `cheetah run` with fast probes (every 200 ms, down after 2 failures, up after 2
//! successes) over three nginx servers:
//! - before any client traffic the LB becomes ready (`GET /ready` 200, `ctl ready` exit 0)
//!   and knows every server's clock from its own probes (`clock_probed`);
//! - under load (keep-alive sessions and short connections), stopping s2's nginx takes s2
//!   out: `ctl servers list` shows it down with the reason (`refused`), and from then on
//!   every request succeeds; no connection on s1 or s3 breaks (only connections on s2, and
//!   new connections sent to s2 before the probes noticed);
//! - starting s2's nginx again puts it back: it is up and serves new connections.
//!
//! In nat the probes' SYN-ACKs come from DIP:80 like the servers' replies; the XDP program
//! must hand them to the host kernel (they are addressed to the LB's own address).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

live_tests! {
    fn l2_health_checks_take_a_stopped_server_out_and_back() {
        scenario("l2", "hcl");
    }
    fn nat_health_checks_take_a_stopped_server_out_and_back() {
        scenario("nat", "hcn");
    }
}

/// Probe settings: a stopped server is out within 2 x 200 ms (+ the timeout).
const HEALTH: &str = "interval_ms = 200\ntimeout_ms = 100\nfall = 2\nrise = 2\n";
/// Longest the test waits for a health change it caused.
const DECIDE_WITHIN: Duration = Duration::from_secs(5);

fn scenario(forwarding: &str, prefix: &str) {
    let testbed = Testbed::up(
        prefix,
        &[
            "--servers",
            "3",
            "--clients",
            "1",
            "--forwarding",
            forwarding,
        ],
    );
    let config = config_with_fast_probes(&testbed);
    let lb = Lb::start(&testbed, &config);

    // Ready before any client traffic, with every server's clock from a probe.
    let ready_at = wait_for(&lb, "the LB to be ready", Duration::from_secs(10), || {
        lb.ctl(&["ready"]).status.success()
    });
    eprintln!("{forwarding}: ready {ready_at:?} after the data path came up");
    let (code, body) = api_get(&lb, "/ready");
    assert_eq!(code, "200", "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        serde_json::json!({"ready": true, "waiting": []})
    );
    for server in servers(&lb) {
        assert_eq!(server["clock_probed"], true, "{server}");
        assert_eq!(server["health"][0]["state"], "up", "{server}");
    }
    assert_eq!(metric_sum(&lb.metrics(), "cheetah_ready", &[]), 1.0);

    let load = Loadgen::start_until_finished(
        &testbed,
        "c1",
        "health",
        &[
            "--keepalive",
            "30",
            "--keepalive-interval",
            "200ms",
            "--short-rate",
            "30/s",
            "--request-timeout",
            "5s",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));

    // s2's nginx stops: s2 refuses, and goes down.
    let stopped_at = unix_ms();
    nginx(&testbed, "s2", &["-s", "stop"]);
    wait_for(&lb, "s2 down", DECIDE_WITHIN, || {
        health_of(&lb, 2).0 == "down"
    });
    let down_at = unix_ms();
    let (_, reason) = health_of(&lb, 2);
    assert_eq!(reason, "refused", "{forwarding}");
    let table = lb.ctl_ok(&["servers", "list"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("2 "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.ends_with("down (refused)"), "{table}");
    assert_eq!(
        metric_sum(
            &lb.metrics(),
            "cheetah_server_up",
            &["server=\"2\"", &format!("vip=\"{}\"", testbed.vip())]
        ),
        0.0
    );
    // With s2 out, every new connection is served by s1 or s3.
    for n in 0..12 {
        let (status, server) = request(&testbed);
        assert_eq!(status, "200", "{forwarding}: request {n} with s2 down");
        assert_ne!(server, "s2");
    }
    std::thread::sleep(Duration::from_secs(2));

    // Back: nginx runs again, s2 is up and serves new connections.
    let error_log = server_file(&testbed, "s2", "error.log");
    nginx(&testbed, "s2", &["-e", &error_log]);
    wait_for(&lb, "s2 up again", DECIDE_WITHIN, || {
        health_of(&lb, 2).0 == "up"
    });
    let served_by_s2 = (0..12).filter(|_| request(&testbed).1 == "s2").count();
    assert!(
        served_by_s2 >= 2,
        "{forwarding}: s2 is back but served {served_by_s2} of 12 new connections"
    );
    std::thread::sleep(Duration::from_secs(1));

    let report = load.finish();
    let started = report["started_at_unix_ms"].as_u64().unwrap();
    let window = (
        (stopped_at - started) as f64 / 1000.0,
        // The probes' verdict reaches the pools at once; a SYN sent just before may still
        // land on s2.
        (down_at - started) as f64 / 1000.0 + 0.5,
    );
    for broken in report["broken"].as_array().unwrap() {
        let servers: Vec<&str> = broken["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let t = broken["t"].as_f64().unwrap();
        let on_s2 = servers == ["s2"];
        let refused_before_down = servers.is_empty() && t >= window.0 && t <= window.1;
        assert!(
            on_s2 || refused_before_down,
            "{forwarding}: a connection broke that was not s2's, or after s2 was out ({window:?}): {broken}"
        );
    }
    let requests = &report["requests_by_server"];
    for server in ["s1", "s2", "s3"] {
        assert!(count(&requests[server]) > 0, "{server}: {requests}");
    }
    eprintln!(
        "{forwarding}: s2 out {} ms after its nginx stopped; {} connections broke (on s2, or refused by s2 before it was out), {} requests",
        down_at - stopped_at,
        report["connections_broken"],
        report["requests"]
    );
    assert_eq!(
        drops_by_reason(&lb.metrics())
            .get("ts_msb_unknown")
            .copied()
            .unwrap_or(0),
        0,
        "every server's clock was known from the first packet"
    );
}

/// The testbed's config with `[vips.health]` set to [`HEALTH`].
fn config_with_fast_probes(testbed: &Testbed) -> PathBuf {
    let text = std::fs::read_to_string(testbed.config_path()).unwrap();
    let mut config: toml::Table = text.parse().unwrap();
    let health: toml::Table = HEALTH.parse().unwrap();
    config["vips"].as_array_mut().unwrap()[0]
        .as_table_mut()
        .unwrap()
        .insert("health".into(), toml::Value::Table(health));
    let path = testbed.dir.join("cheetah-health.toml");
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    path
}

/// Polls `done` every 50 ms; how long it took. Fails after `within`.
fn wait_for(lb: &Lb, what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?}; servers: {}",
            lb.ctl_ok(&["servers", "list"])
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// `GET path` on the LB's API, from its namespace: (status code, body).
fn api_get(lb: &Lb, path: &str) -> (String, String) {
    let out = in_netns(
        lb.namespace(),
        "curl",
        &[
            "-s",
            "-m",
            "5",
            "-w",
            "\n%{http_code}",
            &format!("http://127.0.0.1:9180{path}"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
    (code.to_string(), body.to_string())
}

fn servers(lb: &Lb) -> Vec<Value> {
    let text = lb.ctl_ok(&["--json", "servers", "list"]);
    let list: Value = serde_json::from_str(&text).unwrap();
    list["servers"].as_array().unwrap().clone()
}

/// Server `id`'s health on the (only) VIP: (state, reason).
fn health_of(lb: &Lb, id: u64) -> (String, String) {
    let server = servers(lb)
        .into_iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no server {id}"));
    let health = &server["health"][0];
    (
        health["state"].as_str().unwrap().to_string(),
        health["reason"].as_str().unwrap().to_string(),
    )
}

fn server_file(testbed: &Testbed, server: &str, file: &str) -> String {
    testbed
        .dir
        .join(server)
        .join(file)
        .to_string_lossy()
        .into_owned()
}

/// `nginx -c <its config> ARGS` in the server's namespace.
fn nginx(testbed: &Testbed, server: &str, args: &[&str]) {
    let config = server_file(testbed, server, "nginx.conf");
    let mut all = vec!["-c", config.as_str()];
    all.extend_from_slice(args);
    in_netns_ok(&testbed.ns(server), "nginx", &all);
}

/// One request on a new connection from `c0`: (status, X-Server).
fn request(testbed: &Testbed) -> (String, String) {
    let url = format!("http://{}/", testbed.vip());
    let mut words = curl_write_out(
        testbed,
        "c0",
        &url,
        "%{http_code} %header{x-server}",
        &["-m", "5"],
    )
    .into_iter();
    (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    )
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
