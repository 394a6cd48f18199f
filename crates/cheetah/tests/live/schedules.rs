//! Live test: awrr's SYNs placed in the kernel from the cycle `cheetah run` publishes at
//! every fold (docs/dataplane.md "Schedules"). Three servers, awrr on reported loads, one
//! server reported idle and two busy: the buckets are 20, 8, 8, so the idle one must get
//! about 20/36 of the new connections (a third if the kernel served the balanced cycle it
//! starts from), with no SYN handed up as `new_connection` and the cycle's replacements
//! (outside the publish window) handing up no packet as `publishing`.

use std::time::Duration;

use crate::support::*;

live_tests! {
    fn s4_awrr_syns_follow_the_published_cycle_in_the_kernel() {
        scenario("s4a");
    }
}

fn new_connections(lb: &Lb, id: u16) -> f64 {
    metric_sum(
        &lb.metrics(),
        "cheetah_server_new_connections_total",
        &[&format!("server=\"{id}\"")],
    )
}

fn handed_up(lb: &Lb, reason: &str) -> f64 {
    metric_sum(
        &lb.metrics(),
        "cheetah_xdp_to_userspace_total",
        &[&format!("reason=\"{reason}\"")],
    )
}

fn scenario(prefix: &str) {
    let testbed = Testbed::up(
        prefix,
        &["--servers", "3", "--clients", "1", "--forwarding", "l2"],
    );
    let lb = Lb::start(&testbed, &testbed.config_path());
    let vip = testbed.vip();
    lb.ctl_ok(&["policy", "set", &vip, "awrr", "--metric", "reported"]);
    for (id, value) in [("1", "0"), ("2", "1"), ("3", "1")] {
        lb.ctl_ok(&["load", "report", id, "--value", value]);
    }
    // A few folds (50 ms each) publish the cycle; the metrics refresh once a second.
    std::thread::sleep(Duration::from_millis(1500));
    let before: Vec<f64> = (1..=3).map(|id| new_connections(&lb, id)).collect();
    let (up_new_before, publishing_before) = (
        handed_up(&lb, "new_connection"),
        handed_up(&lb, "publishing"),
    );
    let load = Loadgen::start(
        &testbed,
        "c1",
        "awrr-short",
        &[
            "--duration",
            "6s",
            "--keepalive",
            "0",
            "--short-rate",
            "150/s",
        ],
    );
    let report = load.finish();
    assert_nothing_broken(&report, "awrr in the kernel");
    std::thread::sleep(Duration::from_millis(1500));
    let placed: Vec<f64> = (1..=3)
        .map(|id| new_connections(&lb, id) - before[id as usize - 1])
        .collect();
    let total: f64 = placed.iter().sum();
    let up_new = handed_up(&lb, "new_connection") - up_new_before;
    let publishing = handed_up(&lb, "publishing") - publishing_before;
    eprintln!(
        "new connections by server {placed:?} ({total} in all), handed up as new_connection {up_new}, as publishing {publishing}"
    );
    assert!(total >= 300.0, "too few connections: {placed:?}");
    assert_eq!(up_new, 0.0, "SYNs went up as new_connection");
    assert_eq!(publishing, 0.0, "packets went up as publishing");
    let idle_share = placed[0] / total;
    assert!(
        (idle_share - 20.0 / 36.0).abs() < 0.05,
        "the idle server got {:.3} of the connections, not about {:.3}: {placed:?}",
        idle_share,
        20.0 / 36.0
    );
}
