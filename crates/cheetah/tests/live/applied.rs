//! Live: a change `cheetah ctl` has returned from is one the packets see.
//!
//! The XDP program reads copies of the core's tables that the daemon writes into its maps
//! (`xdp_tables.rs`). An operator who takes a server out of a pool and sees the command
//! return expects the next connection to go elsewhere; a script that adds a server to
//! every instance, one after the other, expects each instance to forward that server's
//! replies once its command has returned (`multi.rs`). Here the pool alternates between s1
//! and s2, and a new connection follows every change at once: each must land on the one
//! server now in the pool.

use crate::support::*;

/// Pool swaps; each is followed by one new connection. Were the answer sent before the
/// maps held the change, about half the connections right after a swap would still land
/// on the server that just left.
const SWAPS: usize = 16;

live_tests! {
    fn l2_a_pool_change_that_returned_steers_the_next_connection() {
        scenario("l2", "apl");
    }
    fn nat_a_pool_change_that_returned_steers_the_next_connection() {
        scenario("nat", "apn");
    }
}

fn scenario(forwarding: &str, prefix: &str) {
    let testbed = Testbed::round_robin(prefix, forwarding, 2, 1);
    let lb = Lb::start(&testbed, &testbed.config_path());
    let vip = testbed.vip();
    // Both servers start in the pool: s1 alone before the first swap.
    lb.ctl_ok(&["pool", "leave", &vip, "2"]);
    let mut wrong = Vec::new();
    for swap in 0..SWAPS {
        let (joins, leaves) = if swap % 2 == 0 { (2, 1) } else { (1, 2) };
        // Join first: the pool is never empty, so no SYN finds nobody to go to.
        lb.ctl_ok(&["pool", "join", &vip, &joins.to_string()]);
        lb.ctl_ok(&["pool", "leave", &vip, &leaves.to_string()]);
        let (status, server, seconds) = timed_request(&testbed, "c0");
        assert_eq!(
            status, "200",
            "{forwarding}, swap {swap}: no answer ({seconds:.3} s)"
        );
        if server != format!("s{joins}") {
            wrong.push(format!(
                "swap {swap}: s{leaves} left, s{joins} joined, served by {server}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{forwarding}: new connections went to a server the pool no longer had after `ctl` returned: {wrong:#?}"
    );
}
