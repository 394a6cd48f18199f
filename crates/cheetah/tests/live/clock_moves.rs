//! Live: who may move the LB's estimate of a server's clock (docs/timestamps.md, "Who
//! moves a server's clock").
//!
//! - A server that reboots comes back with a clock near 0, far behind what the LB
//!   estimated. New connections to it must work again within seconds: the SYN-ACK of the
//!   LB's own health probe resets the estimate. Were it never to move backwards, every
//!   restore would hand the server TSecr values it never sent, which Linux >= 6.15 rejects
//!   (`TSEcrRejected`), for as long as the server had been up before.
//! - A segment from the client side that claims to be a server's reply (its address and
//!   port, in l2 even its MAC) with a TSval far ahead must teach the LB nothing: were it
//!   learnt, the restores of that server would be that far off, and its new connections
//!   would stall the same way.

use std::time::{Duration, Instant};

use crate::support::*;

/// How long a rebooted server may take to serve new connections through the LB: a few
/// probe intervals (1 s by default) and a request.
const BACK_WITHIN: Duration = Duration::from_secs(10);
/// A request through the LB that takes longer lost a segment (a restore the server
/// rejected costs a retransmission, 200 ms at least).
const REQUEST_SECS: &str = "2";
/// How far ahead of the server's clock the spoofed TSval is: 2^13 MSB periods (6 days),
/// a forward step for the LB's 16-bit comparison.
const SPOOF_AHEAD: u32 = 0x2000_0000;
/// The server that reboots, or whose replies are spoofed.
const TARGET: &str = "s4";
/// How far back the rebooted server's clock goes: 2^8 MSB periods (4.6 hours of uptime
/// lost). The LB compares MSBs modulo 2^16, so a clock that goes back "to 0" may look like
/// a step forward (s4's MSB is near 2^15); and a step back by fewer than the cookie's 16
/// epochs could be restored right by chance. This step is backwards and far enough.
const REBOOT_BACK_MS: u32 = 1 << 24;

live_tests! {
    fn a_rebooted_server_serves_new_connections_within_seconds() {
        reboot("rb");
    }
    fn l2_spoofed_replies_from_the_client_side_move_no_clock() {
        spoof("l2", "sp");
    }
    fn nat_spoofed_replies_from_the_client_side_move_no_clock() {
        spoof("nat", "sq");
    }
}

fn testbed(forwarding: &str, prefix: &str) -> Testbed {
    Testbed::round_robin(prefix, forwarding, 4, 2)
}

/// `rounds` requests from `client`, one connection each; the servers that answered, or
/// `None` for a request that failed or took longer than [`REQUEST_SECS`].
fn requests(testbed: &Testbed, client: &str, rounds: usize) -> Vec<Option<String>> {
    let url = format!("http://{}/", testbed.vip());
    (0..rounds)
        .map(|_| {
            let words = curl_write_out(
                testbed,
                client,
                &url,
                "%{http_code} %header{x-server}",
                &["-m", REQUEST_SECS],
            );
            match words.as_slice() {
                [code, server] if code == "200" => Some(server.clone()),
                _ => None,
            }
        })
        .collect()
}

/// Asserts that 8 requests (rr over 4 servers: 2 each) all succeed and reach [`TARGET`].
fn assert_every_server_serves(testbed: &Testbed, client: &str, when: &str) {
    let answers = requests(testbed, client, 8);
    assert!(
        answers.iter().all(Option::is_some) && answers.contains(&Some(TARGET.to_string())),
        "{when}: requests through the LB (server per request, None = failed): {answers:?}"
    );
}

fn tsecr_rejected(testbed: &Testbed) -> u64 {
    netstat_counter(&testbed.ns(TARGET), "TcpExt", "TSEcrRejected")
        .expect("this kernel counts TSEcrRejected (Linux >= 6.15)")
}

fn reboot(prefix: &str) {
    let testbed = testbed("l2", prefix);
    let _lb = Lb::start(&testbed, &testbed.config_path());
    assert_every_server_serves(&testbed, "c1", "before the reboot");
    let load = Loadgen::start_until_finished(
        &testbed,
        "c2",
        "reboot-load",
        &[
            "--keepalive",
            "24",
            "--keepalive-interval",
            "300ms",
            "--short-rate",
            "20/s",
            "--request-timeout",
            "3s",
        ],
    );
    std::thread::sleep(Duration::from_secs(3));

    let uptime = (monotonic_ms() as u32)
        .wrapping_add(testbed.clock_offset(TARGET))
        .wrapping_sub(REBOOT_BACK_MS)
        .to_string();
    let printed = cheetah_ok(&[
        "testbed",
        "reboot",
        "--prefix",
        prefix,
        "--server",
        TARGET,
        "--uptime-ms",
        &uptime,
    ]);
    eprintln!("{}", printed.trim());
    let rebooted = Instant::now();
    let rejected_at_reboot = tsecr_rejected(&testbed);
    // Until every request of a round succeeds (and one of them reaches the rebooted server).
    let mut last = Vec::new();
    let back = eventually(BACK_WITHIN, || {
        last = requests(&testbed, "c1", 4);
        last.iter().all(Option::is_some) && last.contains(&Some(TARGET.to_string()))
    });
    let took = rebooted.elapsed();
    assert!(
        back,
        "{TARGET} rebooted {took:?} ago and new connections through the LB still fail \
         (last round: {last:?}; its TCP rejected {} TSecr values since the reboot)",
        tsecr_rejected(&testbed) - rejected_at_reboot
    );
    eprintln!("{TARGET} served new connections {took:?} after its reboot");
    assert_every_server_serves(&testbed, "c1", "after the reboot");

    // The other servers' connections carried on through the reboot; the rebooted server's
    // own ended with it, as a reboot ends them.
    let report = load.finish();
    let elsewhere: Vec<_> = report["broken"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| {
            b["servers"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s != TARGET))
        })
        .collect();
    assert!(
        elsewhere.is_empty(),
        "connections to servers that did not reboot broke: {elsewhere:#?}"
    );
}

fn spoof(forwarding: &str, prefix: &str) {
    let testbed = testbed(forwarding, prefix);
    let lb = Lb::start(&testbed, &testbed.config_path());
    assert_every_server_serves(&testbed, "c1", "before the spoofed replies");
    let rejected_before = tsecr_rejected(&testbed);
    let drops_before = drops_by_reason(&lb.metrics());

    let id: u16 = TARGET[1..].parse().unwrap();
    let (dip, mac) = testbed.server(id);
    let ahead = monotonic_ms() as u32 + testbed.clock_offset(TARGET) + SPOOF_AHEAD;
    let tsval = ahead.to_string();
    let client_c1 = format!("{}:40000", testbed.client_address(1));
    let vip_other_port = format!("{}:40000", testbed.summary["vip"].as_str().unwrap());
    // Each spoof: the client it leaves from, where it claims to come from, where it goes,
    // and the source MAC it claims. c0 sits on the LB's own segment, so its frames reach
    // the LB with whatever MAC they carry; c1's pass the router, which puts its own.
    let (vip_from, dip_from) = (
        format!("{}:80", testbed.summary["vip"].as_str().unwrap()),
        format!("{dip}:80"),
    );
    let spoofs: Vec<(&str, &str, &str, Option<&str>)> = match forwarding {
        // A VIP's address and port, and the server's MAC: all an l2 LB checks on a reply.
        "l2" => vec![("c0", &vip_from, &client_c1, Some(&mac))],
        // The case: DIP:backend_port to VIP:any port, from behind the router; and
        // to a client's address from the LB's own segment.
        _ => vec![
            ("c1", &dip_from, &vip_other_port, None),
            ("c0", &dip_from, &client_c1, None),
        ],
    };
    for (client, from, target, src_mac) in &spoofs {
        let mut args = vec![
            "--spoofed-replies",
            "20",
            "--from",
            from,
            "--tsval",
            &tsval,
            "--target",
            target,
        ];
        if let Some(mac) = src_mac {
            args.extend(["--src-mac", mac]);
        }
        let summary = inject(&testbed.ns(client), &args);
        eprintln!("{client}: {summary}");
    }
    std::thread::sleep(Duration::from_millis(500));

    assert_every_server_serves(&testbed, "c1", "after the spoofed replies");
    let rejected = tsecr_rejected(&testbed) - rejected_before;
    assert_eq!(
        rejected, 0,
        "{TARGET}'s TCP rejected {rejected} TSecr values after the spoofed replies: the LB \
         learnt a clock from them"
    );
    // Each spoof was dropped, for the reason its path gives: one arriving on a client-side
    // interface (c0's, on the LB's own segment) is not believed to be a reply; one
    // addressed to a VIP (from c1, through the router) never is one. The workers count
    // their drops at once, the kernel's reach the metrics within a second.
    let addressed_to_a_vip = spoofs.iter().filter(|s| s.2 == vip_other_port).count() as u64;
    let client_side = spoofs.len() as u64 - addressed_to_a_vip;
    let counted = Instant::now();
    let drops = loop {
        let drops = deltas(&drops_before, &drops_by_reason(&lb.metrics()));
        let all = drops.get("reply_from_client_side").copied().unwrap_or(0)
            + drops.get("vip_port_unknown").copied().unwrap_or(0);
        if all >= 20 * spoofs.len() as u64 || counted.elapsed() > Duration::from_secs(3) {
            break drops;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("drops during the spoof: {drops:?}");
    let dropped = |reason: &str| drops.get(reason).copied().unwrap_or(0);
    assert_eq!(
        dropped("reply_from_client_side"),
        20 * client_side,
        "drops: {drops:?}"
    );
    assert_eq!(
        dropped("vip_port_unknown"),
        20 * addressed_to_a_vip,
        "drops: {drops:?}"
    );
}
