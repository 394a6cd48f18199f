//! Live: path MTU discovery through the LB. The router's links to the clients carry 1200
//! bytes, the servers send 1500-byte segments with DF, so every download's first large
//! segments are refused with ICMP "fragmentation needed" from the router, addressed to the
//! VIP (the segments' source). Unless the LB sends each error to the server that sent the
//! segment, the server never lowers its path MTU and the download stalls: a PMTU black
//! hole. A client with TCP timestamps is found by the cookie its quoted segment carries;
//! one without (`--clients-without-timestamps`, as Windows clients) by the fallback table.
//! Both must be routed in the XDP program itself, so no such error goes to a worker.

use std::time::Duration;

use crate::support::*;

/// The MTU of the router's links toward the clients.
const NARROW_MTU: &str = "1200";
/// Bytes each download asks for (a range of `/large`): many full-sized segments.
const DOWNLOAD_BYTES: u64 = 4 << 20;
/// Downloads per client: with rr over two servers, each server serves each client.
const DOWNLOADS: usize = 4;

live_tests! {
    fn l2_downloads_through_a_narrow_link_complete() {
        narrow_link("l2", "pm2");
    }
    fn nat_downloads_through_a_narrow_link_complete() {
        narrow_link("nat", "pmn");
    }
}

fn narrow_link(forwarding: &str, prefix: &str) {
    let testbed = Testbed::up(
        prefix,
        &[
            "--servers",
            "2",
            "--clients",
            "2",
            "--clients-without-timestamps",
            "1",
            "--forwarding",
            forwarding,
            "--policy",
            "rr",
        ],
    );
    let lb = Lb::start(&testbed, &testbed.config_path());
    let router = testbed.ns("rt");
    for link in ["rt-c1", "rt-c2"] {
        in_netns_ok(&router, "ip", &["link", "set", link, "mtu", NARROW_MTU]);
    }
    let refused = || netstat_counter(&router, "IcmpMsg", "OutType3").unwrap_or(0);
    let refused_before = refused();
    let before = lb.metrics();

    let url = format!("http://{}/large", testbed.vip());
    let range = format!("0-{}", DOWNLOAD_BYTES - 1);
    // c1 sends timestamps, c2 (the last client) does not.
    for client in ["c1", "c2"] {
        for n in 0..DOWNLOADS {
            let words = curl_write_out(
                &testbed,
                client,
                &url,
                "%{http_code} %{size_download} %{time_total}",
                &["-r", &range, "-m", "20"],
            );
            eprintln!("{client} download {n}: {words:?}");
            assert_eq!(
                words.first().map(String::as_str),
                Some("206"),
                "{client}'s download {n} got no answer: {words:?}"
            );
            assert_eq!(
                words.get(1).and_then(|w| w.parse::<u64>().ok()),
                Some(DOWNLOAD_BYTES),
                "{client}'s download {n} stalled short of {DOWNLOAD_BYTES} bytes (a PMTU black hole?): {words:?}"
            );
        }
    }
    // The kernel's counts reach /metrics within a second.
    std::thread::sleep(Duration::from_millis(1_500));
    let after = lb.metrics();
    let moved = |event: &str| kernel_event(&after, event) - kernel_event(&before, event);
    let handed_up = handed_up_between(&before, &after);
    let up = |reason: &str| handed_up.get(reason).copied().unwrap_or(0);
    let by_cookie = moved("icmp_routed_by_cookie");
    let by_fallback = moved("icmp_routed_by_fallback");
    let router_refused = refused() - refused_before;
    eprintln!(
        "{forwarding}: the router sent {router_refused} destination-unreachable; the XDP program routed {by_cookie} by cookie and {by_fallback} by the fallback table; handed up: icmp {}, layout {}, other {}",
        up("icmp"),
        up("layout"),
        up("other")
    );
    assert!(
        router_refused > 0,
        "the router refused no segment: was the link narrow?"
    );
    assert!(
        by_cookie > 0.0,
        "no error about c1's connections was routed by its cookie in the kernel"
    );
    assert!(
        by_fallback > 0.0,
        "no error about c2's connections (no timestamps) was routed by the fallback table in the kernel"
    );
    for reason in ["icmp", "layout", "other"] {
        assert_eq!(up(reason), 0, "errors went to a worker as {reason}");
    }
}
