//! Live: a client whose first SYN-ACKs are lost completes its connection on the server that
//! answered its retried SYN, and no load count stays raised for the server it left.
//!
//! `cheetah run` with rr over two nginx servers, a real Linux client. The client's first
//! SYN goes to one server (`first`); that server's first two SYN-ACKs are dropped on the
//! switch (a loss in the network, so the server's own stack does not notice: dropping in the
//! server's output path fails the send, and Linux then gives up the half-open connection at
//! once). Both the client's SYN retransmission and the first server's SYN-ACK
//! retransmission fire about 1 s after the first try; dropping two SYN-ACKs lets the other
//! server (`second`), which rr gives the retried SYN, answer first. What the test then
//! checks is what Linux really does (docs/design.md, "A retried SYN"): the first server's
//! later SYN-ACK retransmissions reach the client, which answers them with challenge ACKs
//! echoing the *second* server's cookie, so no RST ever lowers the first server's count:
//! the LB must release it itself when it sees the retried SYN.
//!
//! A client without timestamps that retries its SYN stays on the first server (the fallback
//! table remembers it), and the XDP program takes the retried SYN's answer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::*;
use cheetah_core::cookie::{tcp_ts, CookieLayout};
use cheetah_core::hash::{FlowHasher, FlowKey};

/// Outside Linux's ephemeral range (32768-60999), so no other connection uses it.
const CLIENT_PORT: u16 = 31_000;
const REQUESTS: usize = 8;

live_tests! {
    fn a_lost_syn_ack_leaves_the_connection_on_the_second_server_and_no_count_on_the_first() {
        scenario();
    }
    fn a_client_without_timestamps_that_retries_its_syn_is_answered_in_the_kernel() {
        without_timestamps();
    }
}

/// A rule on the switch that drops SYN-ACKs from one server's port toward the client port.
struct SynAckDrop(NftTable);

impl SynAckDrop {
    fn install(testbed: &Testbed, server: u16) -> Self {
        // The bridge family sees frames between the switch ports (the testbed keeps the
        // bridge out of iptables, not out of nftables' own bridge hooks).
        let chain = format!(
            "  chain forward {{\n    type filter hook forward priority 0;\n    \
             iifname \"sw-s{server}\" tcp sport 80 tcp dport {CLIENT_PORT} \
             tcp flags & (syn|ack) == syn|ack counter drop\n  }}\n"
        );
        let table = format!("cheetah_test_synack_s{server}");
        SynAckDrop(NftTable::install(
            testbed,
            &testbed.ns("sw"),
            "bridge",
            &table,
            &chain,
        ))
    }

    /// SYN-ACKs dropped so far.
    fn dropped(&self) -> u64 {
        let text = self.0.list();
        text.split("packets ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counter in:\n{text}"))
    }

    fn remove(&mut self) {
        self.0.remove();
    }
}

fn scenario() {
    let testbed = Testbed::up("sr", &["--servers", "2", "--clients", "1"]);
    // A fresh LB that has placed no connection yet: whichever worker sees the retried SYN,
    // rr gives it the server the first SYN did not get (each worker's cursor starts at its
    // index, and a worker that placed the first SYN has moved on).
    let lb = Lb::start(&testbed, &testbed.config_path());
    let client_ns = testbed.ns("c1");
    let syn_challenges_before = syn_challenges(&client_ns);

    let mut drops = [
        SynAckDrop::install(&testbed, 1),
        SynAckDrop::install(&testbed, 2),
    ];
    let capture = Capture::start(
        &client_ns,
        "eth0",
        &format!("tcp port {CLIENT_PORT}"),
        &testbed.dir.join("c1-syn-retry.pcap"),
    );
    // One connection, several requests a second apart (curl reuses it), so it lives
    // through the first server's SYN-ACK retransmissions at about 3 s and 7 s.
    let url = format!("http://{}/", testbed.vip());
    let port = CLIENT_PORT.to_string();
    let mut args = vec![
        "-s",
        "--local-port",
        &port,
        "--rate",
        "1/s",
        "-w",
        "%{http_code} %header{x-server} %{local_port}\\n",
    ];
    for _ in 0..REQUESTS {
        args.extend(["-o", "/dev/null", url.as_str()]);
    }
    let curl_log = testbed.dir.join("curl.log");
    let mut curl = spawn_in_netns(&client_ns, "curl", &args, &curl_log);

    // The server whose SYN-ACK is dropped first got the first SYN; the other one's rule
    // must go before the retried SYN reaches it, about 1 s later.
    let started = Instant::now();
    let first = first_dropped(&drops, started);
    let second = 1 - first;
    drops[second].remove();
    let (first_id, second_id) = (first as u16 + 1, second as u16 + 1);
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "too slow to let server {second_id} answer the retried SYN"
    );
    // Two lost SYN-ACKs: the original and the retransmission that races the client's
    // retried SYN. Later ones pass, as after a real transient loss.
    assert!(
        eventually(Duration::from_secs(3), || drops[first].dropped() >= 2),
        "server {first_id} did not retransmit its SYN-ACK within 3 s"
    );
    drops[first].remove();

    // The connection is established on the second server, and the counts say so, while
    // it lives.
    let counts_follow_the_connection = eventually(Duration::from_secs(5), || {
        let active = lb.active_connections();
        count_of(&active, first_id) == 0 && count_of(&active, second_id) == 1
    });
    assert!(
        counts_follow_the_connection,
        "while the connection lives on server {second_id}: {:?}",
        lb.active_connections()
    );

    let status = curl.wait().unwrap();
    let output = std::fs::read_to_string(&curl_log).unwrap();
    assert!(status.success(), "curl failed: {status}\n{output}");
    let answers: Vec<&str> = output.lines().collect();
    let expected = format!("200 s{second_id} {CLIENT_PORT}");
    assert_eq!(answers.len(), REQUESTS, "curl's answers:\n{output}");
    assert!(
        answers.iter().all(|a| *a == expected),
        "every request on the one connection should be answered by s{second_id}:\n{output}"
    );
    let segments = capture.segments();

    what_the_client_saw(&testbed, &segments, first_id, second_id);
    assert!(
        syn_challenges(&client_ns) > syn_challenges_before,
        "the client answered no SYN-ACK with a challenge ACK"
    );

    // After the close (the second server's FIN), nothing stays counted anywhere, and it
    // took no load report.
    assert!(
        eventually(Duration::from_secs(5), || {
            lb.active_connections().values().all(|n| *n == 0)
        }),
        "a count stayed raised: {:?}",
        lb.active_connections()
    );
    assert!(lb.event_count("syn_retransmissions") >= 1.0);
    assert_eq!(
        lb.event_count("handshake_count_moved"),
        0.0,
        "the holder answered first: no count should have moved"
    );
}

/// A client without timestamps (a Windows client; here Linux at `tcp_timestamps=0`) whose
/// first SYN-ACK is lost retries its SYN. The fallback table sends the retry where the
/// first SYN went, and that server's answer is the first answer to a recently retried SYN
/// (the handshake slot is marked, no count moves) and teaches the table the server. The
/// XDP program takes all of it; before, the answer went to a worker as
/// `handshake_or_close`.
fn without_timestamps() {
    let testbed = Testbed::up("srn", &["--servers", "2", "--clients", "1"]);
    let client_ns = testbed.ns("c1");
    set_sysctl(&client_ns, "net.ipv4.tcp_timestamps", "0");
    let lb = Lb::start(&testbed, &testbed.config_path());
    let before = lb.metrics();
    let mut drops = [
        SynAckDrop::install(&testbed, 1),
        SynAckDrop::install(&testbed, 2),
    ];
    let url = format!("http://{}/", testbed.vip());
    let port = CLIENT_PORT.to_string();
    let curl_log = testbed.dir.join("curl-without-timestamps.log");
    let args = [
        "-s",
        "-m",
        "10",
        "--local-port",
        &port,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %header{x-server}",
        url.as_str(),
    ];
    let mut curl = spawn_in_netns(&client_ns, "curl", &args, &curl_log);
    // One SYN-ACK lost, then the way is clear: the client's retried SYN, about 1 s after
    // the first, gets the next one.
    let started = Instant::now();
    let first = first_dropped(&drops, started) as u16 + 1;
    for drop in &mut drops {
        drop.remove();
    }
    let status = curl.wait().unwrap();
    let output = std::fs::read_to_string(&curl_log).unwrap();
    assert!(status.success(), "curl failed: {status}\n{output}");
    assert_eq!(
        output.trim(),
        format!("200 s{first}"),
        "the retried SYN should reach the server the first went to"
    );

    // The kernel's counts reach /metrics within a second.
    std::thread::sleep(Duration::from_millis(1_500));
    let after = lb.metrics();
    let moved = |event: &str| kernel_event(&after, event) - kernel_event(&before, event);
    let handed_up = handed_up_between(&before, &after);
    eprintln!(
        "in the kernel: syn_retransmissions {}, fallback_learned_from_server {}, handshake_count_moved {}; handed up: {handed_up:?}",
        moved("syn_retransmissions"),
        moved("fallback_learned_from_server"),
        moved("handshake_count_moved")
    );
    assert!(
        moved("syn_retransmissions") >= 1.0,
        "the kernel saw no retried SYN"
    );
    assert!(
        moved("fallback_learned_from_server") >= 1.0,
        "no SYN-ACK taught the fallback table in the kernel"
    );
    assert_eq!(moved("handshake_count_moved"), 0.0, "the holder answered");
    assert_eq!(
        handed_up.get("handshake_or_close").copied().unwrap_or(0),
        0,
        "the retried SYN's answer went to a worker: {handed_up:?}"
    );
}

/// Which rule (0 or 1) dropped a SYN-ACK first, waited for up to 5 s from `started`.
fn first_dropped(drops: &[SynAckDrop; 2], started: Instant) -> usize {
    loop {
        if let Some(i) = (0..2).find(|&i| drops[i].dropped() > 0) {
            return i;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no SYN-ACK was dropped: did the SYN reach a server?"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn syn_challenges(namespace: &str) -> u64 {
    netstat_counter(namespace, "TcpExt", "TCPSYNChallenge").expect("TcpExt:TCPSYNChallenge")
}

fn count_of(active: &BTreeMap<u16, u64>, server: u16) -> u64 {
    *active
        .get(&server)
        .unwrap_or_else(|| panic!("server {server} is not listed: {active:?}"))
}

/// The Linux behaviour the design relies on, read from the client's capture with the
/// secret: the first server's SYN-ACK retransmissions arrive after the connection is
/// established, and every ACK of the client, the answers to them included, echoes the
/// second server's cookie. No RST was seen while the connection lived.
fn what_the_client_saw(testbed: &Testbed, segments: &[TcpView], first: u16, second: u16) {
    let vip = *testbed.vip_addr().ip();
    let client = testbed.client_address(1);
    let hash = FlowHasher::new(&testbed.secret()).hash(&FlowKey::tcp(
        u32::from(client),
        CLIENT_PORT,
        u32::from(vip),
        80,
    ));
    let names = |timestamp: u32| {
        CookieLayout::DEFAULT
            .decode(tcp_ts::extract(timestamp), hash)
            .server
            .0
    };

    let from_server = |t: &&TcpView| t.src == vip.octets();
    let syn_acks: Vec<u16> = segments
        .iter()
        .filter(from_server)
        .filter(|t| t.is_syn() && t.is_ack())
        .filter_map(|t| t.timestamps.map(|(tsval, _)| names(tsval)))
        .collect();
    assert_eq!(
        syn_acks.first(),
        Some(&second),
        "the first SYN-ACK to reach the client: {syn_acks:?}"
    );
    assert!(
        syn_acks.iter().filter(|s| **s == first).count() >= 1,
        "no SYN-ACK retransmission of server {first} reached the client: {syn_acks:?}"
    );
    let echoes: Vec<u16> = segments
        .iter()
        .filter(|t| t.src == client.octets() && t.is_ack())
        .filter_map(|t| t.timestamps.map(|(_, tsecr)| names(tsecr)))
        .collect();
    assert!(
        echoes.iter().all(|s| *s == second),
        "client ACKs echoed cookies of {echoes:?}: the challenge ACKs should name server {second}"
    );
    let timeline: Vec<String> = segments
        .iter()
        .map(|t| {
            let from = if t.src == vip.octets() {
                "lb"
            } else {
                "client"
            };
            let named = t
                .timestamps
                .map(|(tsval, tsecr)| format!("tsval s{} tsecr s{}", names(tsval), names(tsecr)));
            format!(
                "{from} flags {:#04x} seq {} ack {} {named:?}",
                t.flags, t.seq, t.ack
            )
        })
        .collect();
    // After the close, a late SYN-ACK of the first server meets the client's TIME_WAIT
    // socket, which answers with an ACK echoing the second server's cookie; the second
    // server, closed by then, may answer that with a RST. Before the close, none.
    let lived = segments
        .iter()
        .take_while(|t| t.flags & 0x01 == 0)
        .filter(|t| t.is_rst())
        .count();
    assert_eq!(
        lived,
        0,
        "RSTs while the connection lived:\n{}",
        timeline.join("\n")
    );
}
