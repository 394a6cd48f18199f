//! Readiness and health as the API, `ctl` and the metrics show them. The decisions are
//! made here the way the prober makes them (its state machine, the book, the overlay, the
//! clock table); the prober itself runs against real TCP in the daemon's
//! `tests/health_probe.rs` and in the live test `health::`.

use std::net::IpAddr;
use std::process::Command;
use std::time::Instant;

use cheetah_core::types::ServerId;
use cheetah_daemon::health::state::{HealthMachine, ProbeOutcome, Thresholds};
use cheetah_daemon::DaemonState;
use serde_json::json;

use crate::common::start;
use crate::metrics::{parse, value};

fn vip() -> (IpAddr, u16) {
    ("10.0.0.100".parse().unwrap(), 80)
}

/// What the prober does with outcomes: the machine decides, the book and the overlay follow.
fn decide(state: &DaemonState, id: u16, outcomes: &[ProbeOutcome]) {
    let key = (vip(), ServerId(id));
    let mut machine = HealthMachine::new(Instant::now());
    let thresholds = Thresholds { fall: 2, rise: 1 };
    for outcome in outcomes {
        machine.record(outcome, thresholds, Instant::now());
        state.health.update(key, &machine, Some(outcome));
    }
    state
        .control()
        .set_health(key.0, key.1, machine.state())
        .unwrap();
}

fn ctl(api: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cheetah"))
        .args(["ctl", "--api", api])
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .unwrap()
}

#[test]
fn readiness_and_health_in_the_api_ctl_and_metrics() {
    let api = start();
    let addr = api.addr();

    // Nothing probed: not ready, and /ready says what it waits for.
    let (code, ready) = api.get("/ready");
    assert_eq!(code, 503);
    assert_eq!(
        ready,
        json!({"ready": false, "waiting": [
            "10.0.0.100:80 server 1: health unknown (not probed yet)",
            "10.0.0.100:80 server 2: health unknown (not probed yet)",
        ]})
    );
    assert_eq!(api.get("/status").1["ready"], false);
    let (_, servers) = api.get("/servers");
    assert_eq!(servers["servers"][0]["clock_probed"], false);
    assert_eq!(servers["servers"][0]["health"][0]["state"], "unknown");
    assert_eq!(servers["servers"][0]["health"][0]["vip"], "10.0.0.100:80");
    let out = ctl(&addr, &["ready"]);
    assert_eq!(out.status.code(), Some(1), "not ready: exit 1");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "not ready; waiting for:\n  10.0.0.100:80 server 1: health unknown (not probed yet)\n  10.0.0.100:80 server 2: health unknown (not probed yet)\n"
    );

    // Server 1 up but its clock not probed yet; server 2 refused twice: down.
    decide(&api.state, 1, &[ProbeOutcome::SynAck]);
    decide(
        &api.state,
        2,
        &[ProbeOutcome::Refused, ProbeOutcome::Refused],
    );
    let (code, ready) = api.get("/ready");
    assert_eq!(code, 503);
    assert_eq!(ready["waiting"], json!(["server 1: clock not probed yet"]));
    api.state
        .shared
        .msb
        .learn_probe(ServerId(1), 7 << 16, api.state.now());
    let (code, ready) = api.get("/ready");
    assert_eq!((code, ready), (200, json!({"ready": true, "waiting": []})));
    assert_eq!(api.get("/status").1["ready"], true);
    let out = ctl(&addr, &["ready"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ready\n");
    let out = ctl(&addr, &["status"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\nready               yes\n"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let (_, servers) = api.get("/servers");
    let two = &servers["servers"][1];
    assert_eq!(two["health"][0]["state"], "down");
    assert_eq!(two["health"][0]["reason"], "refused");
    assert!(two["health"][0]["since_secs"].is_u64());
    assert_eq!(servers["servers"][0]["clock_probed"], true);
    assert_eq!(servers["servers"][0]["health"][0]["reason"], "syn-ack");

    let out = ctl(&addr, &["servers", "list"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let header = text.lines().next().unwrap();
    assert!(header.ends_with("VIPS           HEALTH"), "{text}");
    let row = |id: &str| {
        text.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{text}"))
            .to_string()
    };
    assert!(row("1 ").ends_with("10.0.0.100:80  up (syn-ack)"), "{text}");
    assert!(
        row("2 ").ends_with("10.0.0.100:80  down (refused)"),
        "{text}"
    );

    let (_, _, metrics) = api.text("/metrics");
    let (types, samples) = parse(&metrics);
    assert_eq!(types["cheetah_ready"], "gauge");
    assert_eq!(value(&samples, "cheetah_ready", &[]), 1.0);
    let up = |id: &str| {
        value(
            &samples,
            "cheetah_server_up",
            &[("server", id), ("vip", "10.0.0.100:80")],
        )
    };
    assert_eq!((up("1"), up("2")), (1.0, 0.0));
    let probes = |id: &str, result: &str| {
        value(
            &samples,
            "cheetah_health_probes_total",
            &[("server", id), ("vip", "10.0.0.100:80"), ("result", result)],
        )
    };
    assert_eq!(probes("1", "ok"), 1.0);
    assert_eq!(probes("2", "refused"), 2.0);
    assert_eq!(probes("2", "timeout"), 0.0, "every result, zeros included");
    assert_eq!(value(&samples, "cheetah_vips_failing_open", &[]), 0.0);

    // Server 1 down too: the VIP fails open, counted.
    decide(
        &api.state,
        1,
        &[ProbeOutcome::Timeout, ProbeOutcome::Timeout],
    );
    let (_, _, metrics) = api.text("/metrics");
    let (_, samples) = parse(&metrics);
    assert_eq!(value(&samples, "cheetah_vips_failing_open", &[]), 1.0);
    assert_eq!(value(&samples, "cheetah_fail_open_events_total", &[]), 1.0);
    assert_eq!(
        value(&samples, "cheetah_ready", &[]),
        1.0,
        "every server decided: ready, though failing open"
    );
}
