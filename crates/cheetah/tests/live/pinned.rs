//! Live test: restarts over the XDP program's pinned maps (`[daemon] bpf_pin_dir`,
//! crates/daemon/src/dataplane/pin.rs). Under 100 keep-alive connections and a stream of
//! short ones (so handshakes are always half-open somewhere), the LB is killed with
//! `kill -9` and restarted, then stopped with SIGTERM and restarted:
//! - every restart reuses the pinned maps (its log says the earlier run's state continues);
//! - the kernel's counters in `/metrics` (the `xdp` worker's events, the hand-ups by
//!   reason) never go back;
//! - no connection breaks;
//! - the testbed's teardown removes the pins.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;
use cheetah_lab::scrape;

live_tests! {
    fn n3_restarts_keep_the_kernels_state() {
        scenario("n3p");
    }
}

fn scenario(prefix: &str) {
    let testbed = Testbed::up(
        prefix,
        &["--servers", "2", "--clients", "2", "--forwarding", "l2"],
    );
    let mut lb = Lb::start(&testbed, &testbed.config_path());
    let record = testbed.dir.join("state").join("bpf_pin_dir");
    let pin_dir = PathBuf::from(
        std::fs::read_to_string(&record)
            .unwrap_or_else(|e| panic!("{}: {e}", record.display()))
            .trim(),
    );
    assert!(pin_dir.is_dir(), "{} holds no pins", pin_dir.display());

    let keepalive = Loadgen::start(
        &testbed,
        "c1",
        "pinned-keepalive",
        &[
            "--duration",
            "20s",
            "--keepalive",
            "100",
            "--short-rate",
            "0",
        ],
    );
    let short = Loadgen::start(
        &testbed,
        "c2",
        "pinned-short",
        &[
            "--duration",
            "20s",
            "--keepalive",
            "0",
            "--short-rate",
            "100/s",
        ],
    );
    std::thread::sleep(Duration::from_secs(5));
    let mut counters = kernel_counters(&lb);
    assert!(
        counters
            .get("event new_connections")
            .copied()
            .unwrap_or(0.0)
            > 0.0,
        "the kernel placed no SYN: {counters:?}"
    );
    for (how, start) in [("kill -9", 2u32), ("SIGTERM", 3)] {
        if how == "kill -9" {
            lb.kill9();
        } else {
            lb.stop();
        }
        lb.restart();
        let log = std::fs::read_to_string(lb.log.with_extension(format!("{start}.log")))
            .unwrap_or_default();
        assert!(
            log.contains("an earlier run's state continues")
                && !log.contains("pinned map replaced"),
            "after {how}, the restart did not reuse every pinned map:\n{log}"
        );
        // The counters reach the metrics once a second.
        std::thread::sleep(Duration::from_millis(1500));
        let after = kernel_counters(&lb);
        for (name, before) in &counters {
            let now = after.get(name).copied().unwrap_or(0.0);
            assert!(
                now >= *before,
                "after {how}: the kernel's {name} went back from {before} to {now}"
            );
        }
        counters = after;
        std::thread::sleep(Duration::from_secs(4));
    }
    let keepalive = keepalive.finish();
    let short = short.finish();
    assert_nothing_broken(&keepalive, "restarts over pinned maps (keep-alive)");
    assert_nothing_broken(&short, "restarts over pinned maps (short connections)");
    eprintln!("kernel counters at the end: {counters:?}");

    drop(lb);
    drop(testbed);
    assert!(
        !pin_dir.exists(),
        "the testbed's teardown left the pins in {}",
        pin_dir.display()
    );
}

/// The kernel's counters as `/metrics` shows them: the `xdp` worker's events and the
/// hand-ups to userspace, by name.
fn kernel_counters(lb: &Lb) -> BTreeMap<String, f64> {
    let text = lb.metrics();
    let mut counters = BTreeMap::new();
    for sample in scrape::samples(&text) {
        let name = match sample.name {
            "cheetah_events_total" if sample.label("worker") == Some("xdp") => {
                format!("event {}", sample.label("event").unwrap_or_default())
            }
            "cheetah_xdp_to_userspace_total" => {
                format!("up {}", sample.label("reason").unwrap_or_default())
            }
            _ => continue,
        };
        *counters.entry(name).or_insert(0.0) += sample.value;
    }
    counters
}
