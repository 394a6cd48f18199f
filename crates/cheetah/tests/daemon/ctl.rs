use std::process::{Command, Output};

use cheetah_daemon::api::StatusView;
use serde_json::Value;

use crate::common::start;

fn ctl(api: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cheetah"))
        .args(["ctl", "--api", api])
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[test]
fn ctl_drives_a_running_daemon() {
    let api = start();
    let addr = api.addr();

    let out = ctl(&addr, &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("mode                cheetah"), "{text}");
    assert!(text.contains("2 active, 0 draining, 0 removed"), "{text}");

    let out = ctl(&addr, &["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["forwarding"], "l2");
    // This daemon has its API but no data path (no interfaces, no workers): the window in
    // which a real start answers `status` before the XDP program is attached. Status must
    // say so, since testbeds and operators wait on it before sending traffic.
    let status: StatusView = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!status.data_path_up(), "{status:?}");

    let out = ctl(
        &addr,
        &[
            "servers",
            "add",
            "--dip",
            "10.1.0.9",
            "--mac",
            "02:00:00:01:00:09",
            "--id",
            "9",
            "--vip",
            "10.0.0.100:80:3",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "server 9 added\n");
    let out = ctl(&addr, &["servers", "list"]);
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.starts_with("9 "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("10.1.0.9") && row.contains("active") && row.contains("10.0.0.100:80"),
        "{row}"
    );
    let out = ctl(&addr, &["vips", "list"]);
    assert!(stdout(&out).contains("1*1 2*1 9*3"), "{}", stdout(&out));

    let out = ctl(&addr, &["servers", "drain", "9"]);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "server 9 is draining: no new connections\n");
    let out = ctl(
        &addr,
        &[
            "policy",
            "set",
            "10.0.0.100:80",
            "pow2",
            "--metric",
            "packets",
        ],
    );
    assert!(
        stdout(&out).contains("pow2") && stdout(&out).contains("packets"),
        "{}",
        stdout(&out)
    );
    let out = ctl(&addr, &["weights", "set", "10.0.0.100:80", "1=4"]);
    assert!(
        stdout(&out).contains("1*4 2*1 9*3(draining)"),
        "{}",
        stdout(&out)
    );
    let out = ctl(
        &addr,
        &["load", "report", "1", "--value", "0.5", "--active", "3"],
    );
    assert_eq!(
        stdout(&out),
        "server 1: reported load 0.5, active connections 3\n"
    );
    let out = ctl(&addr, &["servers", "remove", "9"]);
    assert_eq!(
        stdout(&out),
        "server 9 removed; its id is quarantined for 600 s\n"
    );

    // Refusals: status 2 and the daemon's message.
    let out = ctl(&addr, &["servers", "drain", "42"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "error: server 42 does not exist\n");
    let out = ctl(&addr, &["weights", "set", "10.0.0.100:80", "1=0"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: weights.1: weight must be at least 1 (drain the server to stop new connections)\n"
    );
    let out = ctl(
        &addr,
        &[
            "servers",
            "add",
            "--dip",
            "10.1.0.10",
            "--mac",
            "02:00:00:01:00:10",
            "--id",
            "9",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("quarantined"), "{}", stderr(&out));
    let out = ctl(&addr, &["weights", "set", "10.0.0.100:80", "one=2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("`one=2` is not ID=WEIGHT"));
}

#[test]
fn ctl_says_when_the_daemon_is_not_there() {
    // Bind and drop a listener to find a port nothing listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let out = ctl(&addr, &["status"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("not reachable at {addr} (connection refused)")),
        "{err}"
    );
}
