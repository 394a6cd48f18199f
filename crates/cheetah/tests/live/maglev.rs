//! Live: `mode = "maglev"`, the baseline without per-connection consistency, runs in the
//! kernel. The XDP program places every client segment by the VIP's Maglev table
//! (bpf/lib/maglev.h) and the workers see almost nothing; and a server added under load
//! takes over about a third of the table's slots, so established connections whose slots
//! moved reach a server that never saw them and break. That is the breakage cheetah mode
//! exists to avoid (smoke's `add_and_drain_break_nothing` runs the same change through it
//! and breaks none); here it also shows that established segments do follow the Maglev
//! table in the kernel, which a path that kept any per-flow state would hide.
//!
//! The same change in cheetah mode with `policy = "maglev"` breaks nothing: the kernel
//! places each SYN by the same table (0 SYNs handed up), and the cookie, not the table,
//! routes every later segment.

use std::time::Duration;

use crate::support::*;

live_tests! {
    fn maglev_mode_runs_in_the_kernel_and_a_new_server_breaks_connections() {
        scenario("mgl", "maglev");
    }

    fn maglev_policy_places_syns_in_the_kernel_and_a_new_server_breaks_nothing() {
        scenario("mgp", "cheetah");
    }
}

/// `mode`: "maglev" (the baseline), or "cheetah" with the VIP's policy set to maglev.
fn scenario(prefix: &str, mode: &str) {
    let testbed = Testbed::up(
        prefix,
        &[
            "--servers",
            "3",
            "--clients",
            "2",
            "--forwarding",
            "l2",
            "--mode",
            mode,
        ],
    );
    let lb = Lb::start(&testbed, &testbed.config_with_pool(&[1, 2]));
    let cheetah = mode == "cheetah";
    if cheetah {
        lb.ctl_ok(&["policy", "set", &testbed.vip(), "maglev"]);
    }
    let load = Loadgen::start(
        &testbed,
        "c1",
        "maglev-add",
        &[
            "--duration",
            "14s",
            "--keepalive",
            "100",
            "--short-rate",
            "20/s",
        ],
    );
    std::thread::sleep(Duration::from_secs(5));
    let add: Vec<String> = testbed.server_add_args(3);
    lb.ctl_ok(&add.iter().map(String::as_str).collect::<Vec<_>>());
    let report = load.finish();
    let metrics = lb.metrics();

    let kernel = |event: &str| kernel_event(&metrics, event);
    let handed_up = metric_sum(&metrics, "cheetah_xdp_to_userspace_total", &[]);
    let new_connections_up = metric_sum(
        &metrics,
        "cheetah_xdp_to_userspace_total",
        &["reason=\"new_connection\""],
    );
    let broken = count(&report["connections_broken"]);
    eprintln!(
        "{mode}: kernel to_server {} to_client {}; handed up {handed_up} ({new_connections_up} new connections); requests {}; broken {broken}",
        kernel("to_server"),
        kernel("to_client"),
        report["requests"]
    );
    assert!(
        count(&report["requests"]["keepalive"]) > 500,
        "the keep-alive load did not run: {}",
        report["requests"]
    );
    // Every client segment of a maglev VIP is the kernel's, SYNs included.
    assert!(kernel("to_server") > 1000.0, "{metrics}");
    assert!(kernel("to_client") > 1000.0, "{metrics}");
    assert_eq!(new_connections_up, 0.0, "{metrics}");
    assert!(
        handed_up < kernel("to_server") / 100.0,
        "{handed_up} handed up against {} forwarded\n{metrics}",
        kernel("to_server")
    );
    if cheetah {
        // The cookie routes every established segment: the table's change moves only
        // where new connections go.
        assert_nothing_broken(&report, "a server added under policy = maglev");
        assert!(
            kernel("new_connections") > 100.0,
            "SYNs were not placed in the kernel\n{metrics}"
        );
    } else {
        // About 33 of the 100 keep-alive connections move to server 3; fewer than 5 would
        // mean established segments did not follow the table.
        assert!(
            broken >= 5,
            "adding a server under maglev broke {broken} of 100 keep-alive connections: {}",
            report["broken"]
        );
    }
    assert!(
        count(&report["requests_by_server"]["s3"]) > 0,
        "the added server got no requests: {}",
        report["requests_by_server"]
    );
}
