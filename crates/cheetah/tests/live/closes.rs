//! Live: a client cannot steer least-loaded by making a server close more often than it
//! has connections (docs/design.md, "A server's close").
//!
//! `cheetah run` with least-loaded over two nginx servers and a real Linux client, in
//! `c1` behind the router. Four keep-alive connections hold a count of 2 on each server.
//! Then the client:
//!
//! 1. **replays an old segment**: it opens a connection, closes it first (so the server's
//!    socket is gone once the server's FIN is acknowledged), and sends the connection's
//!    last ACK again, cookie and all, 20 times from a raw socket. The LB routes each copy
//!    to the server named by the cookie, whose kernel answers each with an RST for a
//!    connection it does not know: without a timestamp option (checked in the capture).
//!    Counting those drove the server's count to 0;
//! 2. **never acknowledges the server's FIN**: a connection asks for `Connection: close`
//!    while the client's nftables drop the server's FINs on input, so the server
//!    retransmits its FIN every RTO (at least twice, checked in the capture). Counting
//!    each drove the count down once per FIN.
//!
//! After each, both counts are still exactly the connections open, and four new
//! connections split 2/2. Once every connection is closed no count stays raised. Last, a
//! connection aborted with SO_LINGER 0 shows on the wire that Linux's abort RST carries the
//! connection's timestamp (the client's stack is the servers' kernel, tcp_send_active_reset).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::support::*;

const REPLAYS: usize = 20;

live_tests! {
    fn replayed_segments_and_unacknowledged_fins_do_not_lower_a_servers_count() {
        scenario();
    }
}

/// Runs `f` on a thread of its own inside network namespace `namespace` (setns changes
/// only the calling thread's). Sockets it opens belong to that namespace for good, and
/// work from any thread once returned.
fn in_namespace<T: Send>(namespace: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/run/netns/{namespace}");
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                // SAFETY: setns takes a valid fd of a namespace file and a namespace type.
                let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(
                    entered,
                    0,
                    "setns {namespace}: {}",
                    std::io::Error::last_os_error()
                );
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// A keep-alive connection from the client and the server that answered it.
struct Held {
    stream: TcpStream,
    port: u16,
    server: u16,
}

/// Opens a connection to `vip` from `namespace`, without a request yet.
fn connect(namespace: &str, vip: SocketAddrV4) -> TcpStream {
    in_namespace(namespace, || {
        let stream = TcpStream::connect_timeout(&SocketAddr::V4(vip), Duration::from_secs(5))
            .expect("connect to the VIP");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream
    })
}

/// One `GET /` on `stream`; the id of the server that answered (its `X-Server: sN`).
fn get(stream: &mut TcpStream, close: bool) -> u16 {
    let connection = if close { "Connection: close\r\n" } else { "" };
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: cheetah\r\n{connection}\r\n").as_bytes())
        .unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 2048];
    loop {
        let n = stream.read(&mut buffer).expect("the server's answer");
        assert!(n > 0, "connection closed before the answer was complete");
        response.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&response).into_owned();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let header = |name: &str| {
            text[..end].lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.eq_ignore_ascii_case(name)
                    .then(|| value.trim().to_string())
            })
        };
        let length: usize = header("content-length").unwrap().parse().unwrap();
        if response.len() >= end + 4 + length {
            let server = header("x-server").expect("nginx names itself");
            return server.trim_start_matches('s').parse().unwrap();
        }
    }
}

fn open(namespace: &str, vip: SocketAddrV4) -> Held {
    let mut stream = connect(namespace, vip);
    let server = get(&mut stream, false);
    let port = stream.local_addr().unwrap().port();
    // Least-loaded reads the other worker's picks at its next merge (10 ms).
    std::thread::sleep(Duration::from_millis(30));
    Held {
        stream,
        port,
        server,
    }
}

/// Sends `frames` as they are out of `interface` in `namespace`, `gap` apart.
fn send_frames(namespace: &str, interface: &str, frames: &[Vec<u8>], gap: Duration) {
    in_namespace(namespace, || {
        let name = CString::new(interface).unwrap();
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(ifindex, 0, "no {interface} in {namespace}");
        // SAFETY: plain socket(2); closed below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        for frame in frames {
            // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
            let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            to.sll_family = libc::AF_PACKET as u16;
            to.sll_protocol = (libc::ETH_P_IP as u16).to_be();
            to.sll_ifindex = ifindex as i32;
            to.sll_halen = 6;
            to.sll_addr[..6].copy_from_slice(&frame[..6]);
            // SAFETY: `frame` and `to` are valid for the lengths given.
            let sent = unsafe {
                libc::sendto(
                    fd,
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&to as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            assert_eq!(
                sent,
                frame.len() as isize,
                "{}",
                std::io::Error::last_os_error()
            );
            std::thread::sleep(gap);
        }
        // SAFETY: closing the fd opened above.
        unsafe { libc::close(fd) };
    })
}

/// An nftables table in the client that drops the server's FINs to one client port.
fn drop_fins(testbed: &Testbed, namespace: &str, port: u16) -> NftTable {
    let chain = format!(
        "  chain input {{\n    type filter hook input priority 0;\n    \
         tcp sport 80 tcp dport {port} tcp flags & fin == fin counter drop\n  }}\n"
    );
    NftTable::install(testbed, namespace, "inet", "cheetah_test_fin_drop", &chain)
}

/// The counts settle within a few merges; asserts they reach `expected` and stay there.
fn assert_counts(lb: &Lb, expected: &[(u16, u64)], what: &str) {
    let expected: BTreeMap<u16, u64> = expected.iter().copied().collect();
    let reached = eventually(Duration::from_secs(3), || {
        lb.active_connections() == expected
    });
    // A count driven down by stray closes would show on a second look too.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        reached && lb.active_connections() == expected,
        "{what}: active connections {:?}, expected {expected:?}",
        lb.active_connections()
    );
}

fn scenario() {
    let testbed = Testbed::up(
        "cls",
        &[
            "--servers",
            "2",
            "--clients",
            "1",
            "--policy",
            "least-loaded",
        ],
    );
    let lb = Lb::start(&testbed, &testbed.config_path());
    let client = testbed.ns("c1");
    let vip = testbed.vip_addr();
    let client_ip = testbed.client_address(1).octets();
    let from_client = |t: &TcpView, port: u16| t.src == client_ip && t.sport == port;
    let to_client = |t: &TcpView, port: u16| t.dst == client_ip && t.dport == port;

    let mut held: Vec<Held> = (0..4).map(|_| open(&client, vip)).collect();
    assert_counts(&lb, &[(1, 2), (2, 2)], "four connections, least-loaded");

    // 1. Replays of a closed connection's last ACK.
    let capture = Capture::start(
        &client,
        "eth0",
        "tcp port 80",
        &testbed.dir.join("c1-replay.pcap"),
    );
    let victim = open(&client, vip);
    let (port, target) = (victim.port, victim.server);
    // The client closes first; the server's FIN follows, and once the client has
    // acknowledged it the server's socket is gone (the client's sits in TIME_WAIT).
    drop(victim.stream);
    assert_counts(&lb, &[(1, 2), (2, 2)], "after the victim connection closed");
    let last_ack = capture
        .finish()
        .into_iter()
        .rev()
        .find(|frame| {
            parse_tcp(frame).is_some_and(|t| {
                from_client(&t, port)
                    && t.is_ack()
                    && t.flags & 0x07 == 0
                    && t.payload_len == 0
                    && t.timestamps.is_some()
            })
        })
        .expect("the victim connection's last ACK in the capture");
    let resets_before = lb.event_count("resets_without_timestamp");
    let capture = Capture::start(
        &client,
        "eth0",
        &format!("tcp port {port}"),
        &testbed.dir.join("c1-replayed.pcap"),
    );
    send_frames(
        &client,
        "eth0",
        &vec![last_ack; REPLAYS],
        Duration::from_millis(5),
    );
    std::thread::sleep(Duration::from_millis(300));
    let resets: Vec<TcpView> = capture
        .segments()
        .into_iter()
        .filter(|t| to_client(t, port) && t.is_rst())
        .collect();
    assert_eq!(
        resets.len(),
        REPLAYS,
        "server {target} should answer each replay with an RST: {resets:?}"
    );
    assert!(
        resets.iter().all(|t| t.timestamps.is_none()),
        "Linux's RST for an unknown connection carries no timestamp: {resets:?}"
    );
    assert_counts(
        &lb,
        &[(1, 2), (2, 2)],
        &format!("after {REPLAYS} replays drew RSTs from server {target}"),
    );
    // The kernel counts them, and its counts reach the metrics once a second.
    let counted = eventually(Duration::from_secs(3), || {
        lb.event_count("resets_without_timestamp") - resets_before >= REPLAYS as f64
    });
    assert!(counted);
    assert_eq!(
        lb.event_count("resets_without_timestamp") - resets_before,
        REPLAYS as f64
    );

    // 2. A server FIN the client never acknowledges. The rule goes in before the
    // connection opens (it drops only FINs), so no race with the server's close.
    let capture = Capture::start(
        &client,
        "eth0",
        "tcp port 80",
        &testbed.dir.join("c1-fin.pcap"),
    );
    let duplicates_before = lb.event_count("duplicate_closes");
    let mut stream = connect(&client, vip);
    let port = stream.local_addr().unwrap().port();
    let mut fin_drop = drop_fins(&testbed, &client, port);
    let closed_on = get(&mut stream, true);
    // Linux retransmits after about 0.2, 0.6, 1.4 and 3.0 s.
    std::thread::sleep(Duration::from_millis(3_500));
    assert_counts(
        &lb,
        &[(1, 2), (2, 2)],
        &format!("while server {closed_on} retransmits its FIN"),
    );
    let fins = capture
        .segments()
        .into_iter()
        .filter(|t| to_client(t, port) && t.is_fin())
        .count();
    assert!(
        fins >= 3,
        "server {closed_on} sent its FIN {fins} times: expected retransmissions"
    );
    // The kernel counts most of them, and its counts reach the metrics once a second.
    let counted = eventually(Duration::from_secs(3), || {
        lb.event_count("duplicate_closes") - duplicates_before >= (fins - 1) as f64
    });
    let duplicates = lb.event_count("duplicate_closes") - duplicates_before;
    assert!(counted, "{fins} FINs, {duplicates} counted as duplicates");
    fin_drop.remove();
    drop(stream);

    // 3. The counts still tell least-loaded the truth: new connections split evenly.
    let mut placed = BTreeMap::new();
    for _ in 0..4 {
        let connection = open(&client, vip);
        *placed.entry(connection.server).or_insert(0) += 1;
        held.push(connection);
    }
    assert_eq!(
        placed,
        BTreeMap::from([(1, 2), (2, 2)]),
        "least-loaded placed four new connections on equal counts"
    );
    assert_counts(&lb, &[(1, 4), (2, 4)], "eight connections");

    // Every connection closed by the client: each server's FIN counts once.
    let ports: Vec<u16> = held.iter().map(|h| h.port).collect();
    drop(held);
    assert_counts(&lb, &[(1, 0), (2, 0)], "all connections closed");
    eprintln!("closes: replays drew {REPLAYS} RSTs, {fins} FINs counted once, ports {ports:?}");

    // Last (it leaves a count raised: a client's RST never lowers one): Linux's abort RST
    // carries the connection's timestamp.
    let capture = Capture::start(
        &client,
        "eth0",
        "tcp port 80",
        &testbed.dir.join("c1-abort.pcap"),
    );
    let aborted = open(&client, vip);
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on an open socket with a valid linger struct.
    let set = unsafe {
        libc::setsockopt(
            aborted.stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0);
    let port = aborted.port;
    drop(aborted.stream);
    let abort: Vec<TcpView> = capture
        .segments()
        .into_iter()
        .filter(|t| from_client(t, port) && t.is_rst())
        .collect();
    assert!(
        abort.len() == 1 && abort[0].timestamps.is_some(),
        "an aborted connection's RST carries its timestamp: {abort:?}"
    );
}
