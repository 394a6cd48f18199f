//! Live smoke tests: `cheetah run` on the testbed's veths (AF_XDP, 2 queues, 2 workers),
//! real nginx servers and real Linux TCP clients, in l2 and in nat forwarding.
//!
//! Each scenario checks, through the real system:
//! - requests through the VIP succeed, from clients behind a router and on the LB's segment;
//! - both workers forwarded packets;
//! - the cookies a client sees in TSval decode (with the secret, by an independent parser)
//!   to the server that the response's `X-Server` header names;
//! - adding a server and draining one while 100 keep-alive connections run breaks none;
//! - `kill -9` of the LB under load and a restart: no RST at any client, no broken
//!   connection, and the runtime changes survive the restart.

use std::path::Path;
use std::time::Duration;

use crate::support::*;
use cheetah_core::cookie::{tcp_ts, CookieLayout};
use cheetah_core::hash::{FlowHasher, FlowKey};

live_tests! {
    fn l2_forwarding_end_to_end() {
        scenario("l2", "e2l", "xdp");
    }
    fn nat_forwarding_end_to_end() {
        scenario("nat", "e2n", "xdp");
    }
    // The AF_XDP data path alone (the XDP program only steers) keeps its smoke test.
    fn l2_forwarding_end_to_end_on_afxdp() {
        scenario("l2", "e2a", "afxdp");
    }
}

fn scenario(forwarding: &str, prefix: &str, datapath: &str) {
    let testbed = Testbed::up(
        prefix,
        &[
            "--servers",
            "3",
            "--clients",
            "2",
            "--forwarding",
            forwarding,
        ],
    );
    // Server 3 runs nginx but joins the LB only at run time.
    let config = with_datapath(&testbed.config_with_pool(&[1, 2]), datapath);
    let mut lb = Lb::start(&testbed, &config);

    requests_succeed_from_every_client(&testbed);
    cookies_name_the_answering_server(&testbed);
    add_and_drain_break_nothing(&testbed, &lb);
    // With `xdp` the kernel keeps SYNs, established segments, replies and closes: the
    // workers see only what it hands up (a handful of packets here), so only the AF_XDP
    // path can show that both queues' workers carried traffic.
    if datapath == "afxdp" {
        both_workers_forwarded(&lb);
    }
    the_kernel_forwarded_only_on_xdp(&lb, datapath);
    kill_and_restart_break_nothing(&testbed, &mut lb);
}

/// With `datapath = "xdp"` the XDP program forwarded established packets itself, both
/// ways, and placed SYNs (counted as worker `xdp` under the core's events); with `afxdp` it
/// forwarded none.
fn the_kernel_forwarded_only_on_xdp(lb: &Lb, datapath: &str) {
    let metrics = lb.metrics();
    let kernel = |event: &str| kernel_event(&metrics, event);
    let up = metric_sum(&metrics, "cheetah_xdp_to_userspace_total", &[]);
    let next_hop_misses = metric_sum(&metrics, "cheetah_xdp_next_hop_misses_total", &[]);
    let up_next_hop = metric_sum(
        &metrics,
        "cheetah_xdp_to_userspace_total",
        &["reason=\"next_hop\""],
    );
    eprintln!(
        "datapath {datapath}: kernel to_server {} to_client {} cookie_routed {} cookies_inserted {} new_connections {}; handed up {up} ({up_next_hop} for want of a next hop); next-hop misses {next_hop_misses}",
        kernel("to_server"),
        kernel("to_client"),
        kernel("cookie_routed"),
        kernel("cookies_inserted"),
        kernel("new_connections")
    );
    if datapath == "xdp" {
        // The testbed's VIP is rr: the kernel places its SYNs itself.
        for event in ["to_server", "to_client", "new_connections"] {
            assert!(
                kernel(event) > 100.0,
                "the kernel's {event}: {}\n{metrics}",
                kernel(event)
            );
        }
        // Replies take their next hop from the daemon's mirror of the kernel's routes and
        // neighbours (next_hops), not from bpf_fib_lookup: only replies in the moment
        // between a neighbour change and its mirroring may miss.
        assert!(
            next_hop_misses < kernel("to_client") / 10.0,
            "{next_hop_misses} of {} replies missed next_hops\n{metrics}",
            kernel("to_client")
        );
    } else {
        assert_eq!(kernel("fast_path"), 0.0, "{metrics}");
        assert_eq!(up, 0.0, "{metrics}");
    }
}

/// The config at `path` with `[daemon] datapath` set.
fn with_datapath(path: &Path, datapath: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(path).unwrap();
    let mut config: toml::Table = text.parse().unwrap();
    let daemon = config["daemon"].as_table_mut().unwrap();
    daemon.insert("datapath".into(), toml::Value::String(datapath.into()));
    std::fs::write(path, toml::to_string(&config).unwrap()).unwrap();
    path.to_path_buf()
}

/// `curl` from a client namespace: (status, X-Server, local port) per request.
fn curl(testbed: &Testbed, client: &str, path: &str) -> (String, String, u16) {
    let url = format!("http://{}{path}", testbed.vip());
    let write_out = "%{http_code} %header{x-server} %{local_port}";
    let mut words = curl_write_out(testbed, client, &url, write_out, &["-m", "10"]).into_iter();
    (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
        words.next().and_then(|p| p.parse().ok()).unwrap_or(0),
    )
}

fn requests_succeed_from_every_client(testbed: &Testbed) {
    for client in ["c0", "c1", "c2"] {
        for _ in 0..4 {
            let (status, server, _) = curl(testbed, client, "/small");
            assert_eq!(
                status, "200",
                "request from {client} through the VIP failed"
            );
            assert!(
                server == "s1" || server == "s2",
                "{client} was answered by {server:?}, not a pool member"
            );
        }
    }
}

fn cookies_name_the_answering_server(testbed: &Testbed) {
    let hasher = FlowHasher::new(&testbed.secret());
    let vip = *testbed.vip_addr().ip();
    let client = testbed.client_address(1);

    let pcap = testbed.dir.join("c1-cookies.pcap");
    let capture = Capture::start(&testbed.ns("c1"), "eth0", "tcp port 80", &pcap);
    let answers: Vec<(String, u16)> = (0..12)
        .map(|_| {
            let (status, server, port) = curl(testbed, "c1", "/small");
            assert_eq!(status, "200");
            (server, port)
        })
        .collect();
    let frames = capture.finish();

    let mut checked = 0;
    for (server, port) in &answers {
        let expected: u16 = server.trim_start_matches('s').parse().unwrap();
        let key = FlowKey::tcp(u32::from(client), *port, u32::from(vip), 80);
        let hash = hasher.hash(&key);
        let replies: Vec<u32> = frames
            .iter()
            .filter_map(|f| parse_tcp(f))
            .filter(|t| t.src == vip.octets() && t.dport == *port)
            .filter_map(|t| t.timestamps.map(|(tsval, _)| tsval))
            .collect();
        assert!(
            replies.len() >= 3,
            "connection from port {port}: only {} replies with timestamps among {} captured frames ({} TCP)",
            replies.len(),
            frames.len(),
            frames.iter().filter(|f| parse_tcp(f).is_some()).count()
        );
        for tsval in replies {
            let decoded = CookieLayout::DEFAULT.decode(tcp_ts::extract(tsval), hash);
            assert_eq!(
                decoded.server.0, expected,
                "TSval {tsval:#010x} on port {port} decodes to server {} but {server} answered",
                decoded.server.0
            );
            checked += 1;
        }
    }
    assert!(checked >= 36, "too few cookies checked: {checked}");
}

fn add_and_drain_break_nothing(testbed: &Testbed, lb: &Lb) {
    let load = Loadgen::start(
        testbed,
        "c1",
        "add-drain",
        &[
            "--duration",
            "24s",
            "--keepalive",
            "100",
            "--short-rate",
            "20/s",
        ],
    );
    std::thread::sleep(Duration::from_secs(6));
    let add: Vec<String> = testbed.server_add_args(3);
    lb.ctl_ok(&add.iter().map(String::as_str).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_secs(6));
    lb.ctl_ok(&["servers", "drain", "1"]);
    let report = load.finish();

    assert_nothing_broken(&report, "adding server 3 and draining server 1");
    assert!(
        count(&report["requests"]["keepalive"]) > 1000,
        "the keep-alive load did not run: {}",
        report["requests"]
    );
    assert!(
        count(&report["requests_by_server"]["s3"]) > 0,
        "the added server got no requests: {}",
        report["requests_by_server"]
    );
    // Draining stops new connections only: server 1's keep-alive sessions went on.
    assert!(
        count(&report["live_sessions_at_end"]["by_server"]["s1"]) > 0,
        "no session of the drained server lived to the end: {}",
        report["live_sessions_at_end"]
    );
}

fn both_workers_forwarded(lb: &Lb) {
    let metrics = lb.metrics();
    for worker in ["0", "1"] {
        let label = format!("worker=\"{worker}\"");
        let forwarded = metric_sum(
            &metrics,
            "cheetah_packets_total",
            &[&label, "direction=\"tx\""],
        );
        assert!(
            forwarded > 100.0,
            "worker {worker} forwarded {forwarded} packets:\n{metrics}"
        );
    }
}

fn kill_and_restart_break_nothing(testbed: &Testbed, lb: &mut Lb) {
    // SYNs are captured too, to prove the capture saw the traffic it reports no RST in, and
    // FINs, to tell resets of live connections from those of closed ones.
    let filter = "tcp[tcpflags] & (tcp-rst|tcp-syn|tcp-fin) != 0";
    let captures: Vec<Capture> = ["c1", "c2"]
        .iter()
        .map(|c| {
            let path = testbed.dir.join(format!("{c}-rst.pcap"));
            Capture::start(&testbed.ns(c), "eth0", filter, Path::new(&path))
        })
        .collect();
    // On the servers, FINs and RSTs: if a client ever sees an unexplained RST, these say
    // which server sent it and what it had received.
    let server_captures: Vec<(String, Capture)> = ["s1", "s2", "s3"]
        .iter()
        .map(|s| {
            let path = testbed.dir.join(format!("{s}-finrst.pcap"));
            let filter = "tcp[tcpflags] & (tcp-rst|tcp-fin) != 0";
            (
                s.to_string(),
                Capture::start(&testbed.ns(s), "eth0", filter, &path),
            )
        })
        .collect();
    let keepalive = Loadgen::start(
        testbed,
        "c1",
        "kill-keepalive",
        &[
            "--duration",
            "20s",
            "--keepalive",
            "100",
            "--short-rate",
            "20/s",
        ],
    );
    let downloads = Loadgen::start(
        testbed,
        "c2",
        "kill-downloads",
        &[
            "--duration",
            "20s",
            "--keepalive",
            "0",
            "--short-rate",
            "0",
            "--downloads",
            "2",
        ],
    );
    std::thread::sleep(Duration::from_secs(6));
    lb.kill9();
    std::thread::sleep(Duration::from_secs(2));
    lb.restart();
    let keepalive = keepalive.finish();
    let downloads = downloads.finish();
    assert_nothing_broken(&keepalive, "kill -9 and restart (keep-alive)");
    assert_nothing_broken(&downloads, "kill -9 and restart (downloads)");
    assert!(count(&downloads["requests"]["download"]) > 0);
    // Server 3 (added at run time) still gets its connections after the restart, so the
    // restarted LB knew it.
    assert!(count(&keepalive["requests_by_server"]["s3"]) > 0);
    let at_servers: Vec<(String, Vec<TcpView>)> = server_captures
        .into_iter()
        .map(|(name, capture)| (name, capture.segments()))
        .collect();
    for capture in captures {
        let path = capture.path.clone();
        let segments = capture.segments();
        let syns = segments.iter().filter(|t| t.is_syn()).count();
        let resets = segments.iter().filter(|t| t.is_rst()).count();
        let unexplained = unexplained_resets(&segments);
        assert!(syns > 0, "the capture {} saw no SYN at all", path.display());
        eprintln!(
            "{}: {resets} RSTs, {} of them ending half-open or client-closed connections after a SYN-ACK the restart lost",
            path.display(),
            resets - unexplained.len()
        );
        let seen_at_servers: Vec<(&String, &TcpView)> = at_servers
            .iter()
            .flat_map(|(name, segments)| segments.iter().map(move |t| (name, t)))
            .filter(|(_, t)| {
                unexplained
                    .iter()
                    .any(|rst| rst.dport == t.sport || rst.sport == t.sport || rst.dport == t.dport)
            })
            .collect();
        assert!(
            unexplained.is_empty(),
            "{} RST segments at a client that no lost SYN-ACK explains ({}): {unexplained:?}\n\
             FIN/RST segments of those ports at the servers: {seen_at_servers:?}",
            unexplained.len(),
            path.display()
        );
    }
}
