//! Live: a server taken out for maintenance and added back, as an operator does it.
//!
//! `ctl servers drain 3`, `ctl servers remove 3`, then `ctl servers add` with the same DIP
//! and MAC: its old id is quarantined, so it comes back under another id. Its replies must
//! be the new id's from the first SYN-ACK on, in l2 (where the LB tells servers apart by
//! MAC) and in nat (by DIP and port), with the id left to the LB and with one given. Were
//! they taken for the quarantined id's, its SYN-ACKs would be dropped, its clients would
//! retry their SYN after 1 s and land on another server, and it would serve nothing.

use crate::support::*;

/// Time a request may take: a dropped SYN-ACK costs the client a 1 s retry.
const SLOW_SECS: f64 = 0.5;
/// New connections per round; with rr over three servers, about a third land on the
/// re-added one.
const REQUESTS: usize = 24;
/// The fewest of them the re-added server must serve. rr keeps a cursor per CPU in the
/// kernel and per worker in userspace (a SYN that races a publication goes up), each a
/// third give or take one, so three sequences may leave it 3 short of 8; a server whose
/// SYN-ACKs were dropped would serve none (and each request would take a 1 s retry).
const AT_LEAST: usize = REQUESTS / 3 - 3;

live_tests! {
    fn l2_a_server_added_back_serves_at_once() {
        scenario("l2", "rdl");
    }
    fn nat_a_server_added_back_serves_at_once() {
        scenario("nat", "rdn");
    }
}

fn scenario(forwarding: &str, prefix: &str) {
    let testbed = Testbed::round_robin(prefix, forwarding, 3, 1);
    let lb = Lb::start(&testbed, &testbed.config_path());
    let (dip, mac) = testbed.server(3);
    let vip = testbed.vip();

    let mut id = 3u16;
    for requested in [None, Some(7u16)] {
        lb.ctl_ok(&["servers", "drain", &id.to_string()]);
        lb.ctl_ok(&["servers", "remove", &id.to_string()]);
        let mut add = vec!["servers", "add", "--dip", &dip, "--vip", &vip];
        if forwarding == "l2" {
            add.extend(["--mac", &mac]);
        }
        let wanted = requested.map(|id| id.to_string());
        if let Some(wanted) = &wanted {
            add.extend(["--id", wanted]);
        }
        let added = lb.ctl_ok(&add);
        let new_id: u16 = added
            .split_whitespace()
            .nth(1)
            .and_then(|word| word.parse().ok())
            .unwrap_or_else(|| panic!("`ctl servers add` said {added:?}"));
        assert_ne!(new_id, id, "the removed id is quarantined");
        if let Some(wanted) = requested {
            assert_eq!(new_id, wanted);
        }

        let mut served_by_s3 = 0;
        for n in 0..REQUESTS {
            let (status, server, seconds) = timed_request(&testbed, "c0");
            let label = format!("{forwarding}, {added:?}, request {n}");
            assert_eq!(status, "200", "{label}: served by {server:?}");
            assert!(
                seconds < SLOW_SECS,
                "{label}: took {seconds:.3} s (served by {server}): a SYN-ACK was lost"
            );
            served_by_s3 += usize::from(server == "s3");
        }
        assert!(
            served_by_s3 >= AT_LEAST,
            "{forwarding}: the re-added server (id {new_id}) served {served_by_s3} of {REQUESTS} new connections"
        );
        id = new_id;
    }
    assert_eq!(
        drops_by_reason(&lb.metrics())
            .get("server_removed")
            .copied()
            .unwrap_or(0),
        0,
        "no reply of the live server was taken for the removed one's"
    );
}
