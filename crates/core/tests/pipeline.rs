//! End-to-end behaviour of the stateless pipeline on real frames: one or two workers driven
//! by packets from clients and servers, as the LB would see them.

use cheetah_core::config::{ConfiguredState, Forwarding, LbConfig, Mode};
use cheetah_core::cookie::{tcp_ts, CookieLayout};
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::lb::{Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::policy::{PolicyKind, ReportedLoad, MERGE_INTERVAL};
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::types::{NANOS_PER_MS, NANOS_PER_SEC};
use cheetah_core::wire::tcp::flags::{ACK, FIN, PSH, RST, SYN};
use cheetah_core::{DropReason, ServerId, Verdict};

const SECRET: Secret = Secret([0x42; 16]);

struct Lb {
    plane: ControlPlane,
    workers: Vec<Worker>,
}

impl Lb {
    fn new(config: LbConfig, workers: usize) -> Self {
        let plane = ControlPlane::new(&config, &SECRET).unwrap();
        let workers = (0..workers)
            .map(|i| {
                Worker::new(
                    plane.shared().clone(),
                    WorkerConfig::new(i, workers, &config),
                )
            })
            .collect();
        Lb { plane, workers }
    }

    fn with(mode: Mode, forwarding: Forwarding, policy: PolicyKind, servers: u16) -> Self {
        Self::new(testkit::config(mode, forwarding, policy, servers), 1)
    }

    fn process(&mut self, worker: usize, frame: &mut [u8], now: u64) -> Verdict {
        self.workers[worker].process(frame, now, Ingress::ServerSide)
    }

    fn counter(&self, c: Counter) -> u64 {
        self.workers.iter().map(|w| w.counters().get(c)).sum()
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.workers.iter().map(|w| w.counters().drops(r)).sum()
    }
}

fn hash_of(client: u32, port: u16) -> u64 {
    FlowHasher::new(&SECRET).hash(&FlowKey {
        client_ip: client,
        vip_ip: VIP,
        client_port: port,
        vip_port: VIP_PORT,
        protocol: 6,
    })
}

/// One client connection driven through the LB like a real TCP exchange: SYN, SYN-ACK,
/// then data both ways, with the client always echoing the last TSval it received.
struct Conn {
    client: u32,
    port: u16,
    server: Option<ServerId>,
    /// TSval (with cookie) the client last received, echoed as TSecr.
    echo: u32,
    client_clock: u32,
}

impl Conn {
    fn new(n: u32) -> Self {
        Conn {
            client: testkit::client_ip(n),
            port: 20_000 + (n % 40_000) as u16,
            server: None,
            echo: 0,
            client_clock: 7,
        }
    }

    fn syn(&mut self, lb: &mut Lb, worker: usize, now: u64) -> Verdict {
        let mut f = TcpFrame::from_client(
            self.client,
            self.port,
            SYN,
            options::linux_syn(self.client_clock, 0),
        )
        .build();
        let v = lb.process(worker, &mut f, now);
        if let Verdict::ToServer(s) = v {
            self.server = Some(s);
        }
        v
    }

    /// The server answers with `tsval` (its own clock) and `flags`.
    fn server_sends(
        &mut self,
        lb: &mut Lb,
        worker: usize,
        tsval: u32,
        flags: u8,
        now: u64,
    ) -> (Verdict, Vec<u8>) {
        let server = self.server.expect("connection placed").0;
        let opts = if flags & SYN != 0 {
            options::linux_syn(tsval, self.client_clock)
        } else {
            options::nop_nop_ts(tsval, self.client_clock)
        };
        let frame = match lb.plane.config().forwarding {
            Forwarding::L2 => TcpFrame::from_server_l2(server, self.client, self.port, flags, opts),
            Forwarding::Nat => {
                TcpFrame::from_server_nat(server, self.client, self.port, flags, opts)
            }
        };
        let mut f = frame.with_payload(b"HTTP/1.1 200 OK\r\n").build();
        let v = lb.process(worker, &mut f, now);
        if v == Verdict::ToClient {
            self.echo = testkit::timestamps(&f).unwrap().0;
        }
        (v, f)
    }

    fn client_sends(
        &mut self,
        lb: &mut Lb,
        worker: usize,
        flags: u8,
        now: u64,
    ) -> (Verdict, Vec<u8>) {
        self.client_clock += 1;
        let mut f = TcpFrame::from_client(
            self.client,
            self.port,
            flags,
            options::nop_nop_ts(self.client_clock, self.echo),
        )
        .with_payload(b"GET / HTTP/1.1\r\n\r\n")
        .build();
        let v = lb.process(worker, &mut f, now);
        (v, f)
    }
}

#[test]
fn cookie_names_the_server_and_the_server_gets_its_own_tsval_back() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 4);
    let mut conn = Conn::new(1);
    let Verdict::ToServer(server) = conn.syn(&mut lb, 0, NANOS_PER_SEC) else {
        panic!()
    };
    let server_tsval = 0x1234_5678;
    let (v, synack) = conn.server_sends(&mut lb, 0, server_tsval, SYN | ACK, NANOS_PER_SEC);
    assert_eq!(v, Verdict::ToClient);
    assert!(testkit::checksums_valid(&synack));
    let (tsval, _) = testkit::timestamps(&synack).unwrap();
    assert_eq!(tsval & 0xffff, server_tsval & 0xffff, "low bits untouched");
    let decoded =
        CookieLayout::DEFAULT.decode(tcp_ts::extract(tsval), hash_of(conn.client, conn.port));
    assert_eq!(
        decoded.server, server,
        "the cookie decodes (with the secret) to the server"
    );
    assert_eq!(
        decoded.epoch,
        (server_tsval >> 16) as u16 & (CookieLayout::DEFAULT.epochs() - 1)
    );

    let (v, ack) = conn.client_sends(&mut lb, 0, ACK | PSH, NANOS_PER_SEC + NANOS_PER_MS);
    assert_eq!(v, Verdict::ToServer(server));
    assert_eq!(
        &ack[0..6],
        &testkit::server_mac(server.0),
        "destination MAC rewritten (l2)"
    );
    assert_eq!(
        testkit::timestamps(&ack).unwrap().1,
        server_tsval,
        "TSecr restored"
    );
    assert!(testkit::checksums_valid(&ack));
    assert_eq!(lb.counter(Counter::CookieRouted), 1);
    assert_eq!(lb.counter(Counter::NewConnections), 1);
}

#[test]
fn churn_breaks_no_connection_in_cheetah_mode_but_breaks_many_under_hashing() {
    use cheetah_core::testkit::churn;
    let cheetah = churn::run(Mode::Cheetah, 2000);
    assert_eq!(cheetah.changes.len(), 4);
    assert_eq!(
        (cheetah.misrouted_packets, cheetah.dropped_packets),
        (0, 0),
        "{cheetah:?}"
    );
    assert_eq!(cheetah.packets, 6 * 2000);
    let hash = churn::run(Mode::Hash, 2000);
    assert!(
        hash.broken_connections > 500,
        "plain hashing remaps connections when the pool changes: {hash:?}"
    );
    let maglev = churn::run(Mode::Maglev, 2000);
    assert!(
        maglev.broken_connections > 50,
        "Maglev remaps some connections on pool changes: {maglev:?}"
    );
    assert!(maglev.broken_connections < hash.broken_connections);
}

#[test]
fn round_robin_spreads_syns_exactly() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 4);
    let mut counts = [0u32; 5];
    for n in 0..400 {
        let Verdict::ToServer(s) = Conn::new(n).syn(&mut lb, 0, NANOS_PER_SEC) else {
            panic!()
        };
        counts[s.0 as usize] += 1;
    }
    assert_eq!(&counts[1..], &[100, 100, 100, 100]);
}

#[test]
fn nat_rewrites_both_directions_and_keeps_checksums_valid() {
    let mut config = testkit::config(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 2);
    config.vips[0].backend_port = Some(8080);
    let mut lb = Lb::new(config, 1);
    let mut conn = Conn::new(9);
    let mut syn =
        TcpFrame::from_client(conn.client, conn.port, SYN, options::linux_syn(1, 0)).build();
    let Verdict::ToServer(server) = lb.process(0, &mut syn, 1) else {
        panic!()
    };
    conn.server = Some(server);
    let (src, dst, sport, dport) = testkit::addresses(&syn).unwrap();
    assert_eq!(
        (src, dst, sport, dport),
        (conn.client, testkit::server_dip(server.0), conn.port, 8080)
    );
    assert!(testkit::checksums_valid(&syn));

    let mut reply = TcpFrame::from_server_nat(
        server.0,
        conn.client,
        conn.port,
        SYN | ACK,
        options::linux_syn(77 << 16, 1),
    );
    reply.src_port = 8080;
    let mut reply = reply.build();
    assert_eq!(lb.process(0, &mut reply, 2), Verdict::ToClient);
    assert_eq!(
        testkit::addresses(&reply).unwrap(),
        (VIP, conn.client, VIP_PORT, conn.port)
    );
    assert!(testkit::checksums_valid(&reply));
    conn.echo = testkit::timestamps(&reply).unwrap().0;
    let (v, ack) = conn.client_sends(&mut lb, 0, ACK, 3);
    assert_eq!(v, Verdict::ToServer(server));
    assert_eq!(testkit::timestamps(&ack).unwrap().1, 77 << 16);
    assert!(testkit::checksums_valid(&ack));
}

#[test]
fn clients_without_timestamps_stay_on_their_server_through_the_fallback_table() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 8);
    let vip = format!("{}:{VIP_PORT}", std::net::Ipv4Addr::from(VIP));
    let mut placed = Vec::new();
    for n in 0..200 {
        let c = Conn::new(n);
        let mut syn = TcpFrame::from_client(c.client, c.port, SYN, options::windows_syn()).build();
        let Verdict::ToServer(s) = lb.process(0, &mut syn, 1) else {
            panic!()
        };
        placed.push((c, s));
    }
    assert_eq!(lb.counter(Counter::FallbackConnections), 200);
    lb.plane.drain_server(2).unwrap();
    lb.plane.leave_pool(&vip, 4).unwrap();
    for (c, s) in &placed {
        let mut ack = TcpFrame::from_client(c.client, c.port, ACK, vec![]).build();
        assert_eq!(lb.process(0, &mut ack, 2), Verdict::ToServer(*s));
    }
    assert_eq!(lb.counter(Counter::FallbackHits), 200);
    assert_eq!(lb.counter(Counter::FallbackMisses), 0);
}

#[test]
fn syn_ack_without_timestamp_teaches_the_fallback_table() {
    // The client offered timestamps but the server declined: the SYN was placed by the
    // policy (round-robin), so Maglev alone would send later packets elsewhere.
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 8);
    for n in 0..50 {
        let mut c = Conn::new(n);
        let Verdict::ToServer(server) = c.syn(&mut lb, 0, 1) else {
            panic!()
        };
        let mut synack = TcpFrame::from_server_l2(
            server.0,
            c.client,
            c.port,
            SYN | ACK,
            options::windows_syn(),
        )
        .build();
        assert_eq!(lb.process(0, &mut synack, 2), Verdict::ToClient);
        let mut ack = TcpFrame::from_client(c.client, c.port, ACK, vec![]).build();
        assert_eq!(lb.process(0, &mut ack, 3), Verdict::ToServer(server));
    }
    assert_eq!(lb.counter(Counter::FallbackLearnedFromServer), 50);
}

#[test]
fn forged_removed_and_unlearnt_cookies_are_dropped_by_reason() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
    let client = testkit::client_ip(1);
    let hash = hash_of(client, 40_000);
    let send = |lb: &mut Lb, server: u16, version: u16| {
        let cookie = CookieLayout::DEFAULT.encode(ServerId(server), hash, version);
        let mut f = TcpFrame::from_client(
            client,
            40_000,
            ACK,
            options::nop_nop_ts(1, tcp_ts::insert(0x1111, cookie)),
        )
        .build();
        lb.process(0, &mut f, 5)
    };
    assert_eq!(
        send(&mut lb, 1000, 0),
        Verdict::Drop(DropReason::CookieUnknownServer)
    );
    assert_eq!(
        send(&mut lb, 2, 0),
        Verdict::Drop(DropReason::TsMsbUnknown),
        "server 2 has not sent anything yet"
    );
    lb.plane.shared().msb.learn(ServerId(2), 0x0042_0000, 1);
    assert_eq!(send(&mut lb, 2, 0), Verdict::ToServer(ServerId(2)));
    lb.plane.remove_server(2, 10).unwrap();
    assert_eq!(
        send(&mut lb, 2, 0),
        Verdict::Drop(DropReason::CookieServerRemoved)
    );
    assert_eq!(lb.drops(DropReason::CookieUnknownServer), 1);
    assert_eq!(lb.drops(DropReason::TsMsbUnknown), 1);
    assert_eq!(lb.drops(DropReason::CookieServerRemoved), 1);
}

#[test]
fn a_draining_server_keeps_its_connections_and_gets_no_new_ones() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 2);
    let mut conn = Conn::new(3);
    let Verdict::ToServer(server) = conn.syn(&mut lb, 0, 1) else {
        panic!()
    };
    conn.server_sends(&mut lb, 0, 99 << 16, SYN | ACK, 2);
    lb.plane.drain_server(server.0).unwrap();
    for n in 10..30 {
        assert_ne!(Conn::new(n).syn(&mut lb, 0, 3), Verdict::ToServer(server));
    }
    assert_eq!(
        conn.client_sends(&mut lb, 0, ACK, 4).0,
        Verdict::ToServer(server)
    );
}

/// What Linux does when a server's SYN-ACKs are lost (seen on the testbed, see
/// `crates/cheetah/tests/live_syn_retry.rs` and docs/design.md): the client's retried SYN is
/// placed on the other server, which answers first. The first server's later SYN-ACK
/// retransmissions reach the client, which answers each with a challenge ACK echoing the
/// *second* server's cookie, so the first server never gets an ACK it could answer with a
/// RST: it drops its half-open connection silently. The LB must not keep counting it.
#[test]
fn a_retransmitted_syn_that_reaches_a_second_server_leaves_no_count_raised() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 2);
    let loads = lb.plane.shared().loads.clone();
    let mut conn = Conn::new(5);
    let Verdict::ToServer(first) = conn.syn(&mut lb, 0, 1) else {
        panic!()
    };
    lb.workers[0].tick(NANOS_PER_SEC / 2);
    assert_eq!(loads.server(first).active_connections, 1);
    // The first server's SYN-ACKs are lost; the retransmitted SYN (same ISN) goes to the
    // other server.
    let Verdict::ToServer(second) = conn.syn(&mut lb, 0, NANOS_PER_SEC) else {
        panic!()
    };
    assert_ne!(first, second);
    lb.workers[0].tick(NANOS_PER_SEC + NANOS_PER_MS * 20);
    assert_eq!(loads.server(first).active_connections, 0);
    assert_eq!(loads.server(second).active_connections, 1);
    assert_eq!(lb.counter(Counter::SynRetransmissions), 1);

    conn.server_sends(&mut lb, 0, 5 << 16, SYN | ACK, NANOS_PER_SEC);
    conn.client_sends(&mut lb, 0, ACK, NANOS_PER_SEC);
    // The first server retransmits its SYN-ACK; the client, established with the second,
    // sends a challenge ACK that echoes the second server's cookie.
    let mut stale = TcpFrame::from_server_l2(
        first.0,
        conn.client,
        conn.port,
        SYN | ACK,
        options::linux_syn(6 << 16, 1),
    )
    .build();
    assert_eq!(
        lb.process(0, &mut stale, 3 * NANOS_PER_SEC),
        Verdict::ToClient
    );
    let (challenge, _) = conn.client_sends(&mut lb, 0, ACK, 3 * NANOS_PER_SEC);
    assert_eq!(challenge, Verdict::ToServer(second));
    // A client RST for the real connection must not lower the second server's count.
    let mut client_rst = TcpFrame::from_client(
        conn.client,
        conn.port,
        RST,
        options::nop_nop_ts(51, conn.echo),
    )
    .build();
    lb.process(0, &mut client_rst, 3 * NANOS_PER_SEC);
    lb.workers[0].tick(4 * NANOS_PER_SEC);
    assert_eq!(loads.server(first).active_connections, 0);
    assert_eq!(
        loads.server(second).active_connections,
        1,
        "a client's RST does not count"
    );
    assert_eq!(lb.counter(Counter::HandshakeCountMoved), 0);
    conn.server_sends(&mut lb, 0, 7 << 16, FIN | ACK, 5 * NANOS_PER_SEC);
    lb.workers[0].tick(6 * NANOS_PER_SEC);
    assert_eq!(loads.server(second).active_connections, 0);
}

/// The other outcome of the race: the first server's SYN-ACK retransmission passes the LB
/// before the second server's answer, so the client is established with the first server,
/// and the count follows that first answer. The SYN and the SYN-ACKs arrive on different
/// workers, as they do on separate interfaces.
#[test]
fn the_first_answer_to_a_retried_syn_takes_the_count() {
    let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 2);
    let mut lb = Lb::new(config, 2);
    let loads = lb.plane.shared().loads.clone();
    let mut conn = Conn::new(6);
    let Verdict::ToServer(first) = conn.syn(&mut lb, 0, 1) else {
        panic!()
    };
    let Verdict::ToServer(second) = conn.syn(&mut lb, 0, NANOS_PER_SEC) else {
        panic!()
    };
    assert_ne!(first, second);
    conn.server = Some(first);
    let (v, _) = conn.server_sends(&mut lb, 1, 9 << 16, SYN | ACK, NANOS_PER_SEC);
    assert_eq!(v, Verdict::ToClient);
    conn.server = Some(second);
    conn.server_sends(&mut lb, 1, 3 << 16, SYN | ACK, NANOS_PER_SEC);
    for worker in 0..2 {
        lb.workers[worker].tick(2 * NANOS_PER_SEC);
    }
    assert_eq!(loads.server(first).active_connections, 1);
    assert_eq!(loads.server(second).active_connections, 0);
    assert_eq!(lb.counter(Counter::HandshakeCountMoved), 1);
    assert_eq!(
        loads.server(first).new_connections + loads.server(second).new_connections,
        2,
        "both placements are still counted as placements"
    );
}

/// A SYN retransmitted to the same server (a one-server pool here; Maglev for clients
/// without timestamps) is one connection there, not two.
#[test]
fn a_syn_retransmitted_to_the_same_server_counts_once() {
    for timestamps in [true, false] {
        let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 1);
        let loads = lb.plane.shared().loads.clone();
        let options = |clock| {
            if timestamps {
                options::linux_syn(clock, 0)
            } else {
                options::windows_syn()
            }
        };
        let mut verdicts = Vec::new();
        for retry in 0..3u32 {
            let mut syn =
                TcpFrame::from_client(testkit::client_ip(9), 40_000, SYN, options(retry)).build();
            verdicts.push(lb.process(0, &mut syn, u64::from(retry) * NANOS_PER_SEC));
        }
        assert!(verdicts
            .iter()
            .all(|v| *v == Verdict::ToServer(ServerId(1))));
        lb.workers[0].tick(5 * NANOS_PER_SEC);
        assert_eq!(
            loads.server(ServerId(1)).active_connections,
            1,
            "timestamps: {timestamps}"
        );
    }
}

#[test]
fn reported_active_connections_reconcile_the_estimate() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::LeastLoaded, 2);
    for n in 0..10 {
        Conn::new(n).syn(&mut lb, 0, 1);
    }
    lb.workers[0].tick(NANOS_PER_SEC);
    let loads = lb.plane.shared().loads.clone();
    assert_eq!(
        loads.server(ServerId(1)).active_connections + loads.server(ServerId(2)).active_connections,
        10
    );
    lb.plane
        .report_load(
            1,
            ReportedLoad {
                load: Some(0.5),
                active_connections: Some(0),
            },
        )
        .unwrap();
    assert_eq!(loads.server(ServerId(1)).active_connections, 0);
    lb.workers[0].tick(2 * NANOS_PER_SEC);
    // Least-loaded now prefers server 1.
    assert_eq!(
        Conn::new(99).syn(&mut lb, 0, 2 * NANOS_PER_SEC),
        Verdict::ToServer(ServerId(1))
    );
}

#[test]
fn two_workers_restore_every_tsecr_across_three_msb_wraps() {
    // One server clock in ms; packets every second alternate between the workers; each
    // echo comes back up to 30 s later through the other worker.
    let mut lb = Lb::new(
        testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 1),
        2,
    );
    let mut conn = Conn::new(1);
    conn.syn(&mut lb, 0, 0);
    let offset_ms: u32 = 0xfffe_0000; // start just below a wrap of the 32-bit clock too
    let mut pending: Vec<(u64, u32, u32)> = Vec::new(); // (echo time ms, cookie TSval, original)
    let mut checked = 0;
    for t_ms in (0..4 * 65_536u64).step_by(1000) {
        pending.sort_by_key(|p| p.0);
        while pending.first().is_some_and(|p| p.0 <= t_ms) {
            let (_, cookie_tsval, original) = pending.remove(0);
            conn.echo = cookie_tsval;
            let (v, f) = conn.client_sends(
                &mut lb,
                (t_ms / 1000 % 2) as usize,
                ACK,
                t_ms * NANOS_PER_MS,
            );
            assert_eq!(v, Verdict::ToServer(ServerId(1)));
            assert_eq!(testkit::timestamps(&f).unwrap().1, original);
            checked += 1;
        }
        let tsval = offset_ms.wrapping_add(t_ms as u32);
        let flags = if t_ms == 0 { SYN | ACK } else { ACK };
        let (_, f) = conn.server_sends(
            &mut lb,
            (t_ms / 1000 % 2 + 1) as usize % 2,
            tsval,
            flags,
            t_ms * NANOS_PER_MS,
        );
        pending.push((
            t_ms + (t_ms * 7919) % 30_000,
            testkit::timestamps(&f).unwrap().0,
            tsval,
        ));
    }
    assert!(checked > 200);
    assert_eq!(lb.counter(Counter::ServerTsClockUnstable), 0);
    assert!(lb.counter(Counter::MsbAdvanced) >= 3);
}

#[test]
fn a_bad_tcp_checksum_stays_exactly_as_bad() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 1);
    let mut conn = Conn::new(2);
    conn.syn(&mut lb, 0, 1);
    conn.server_sends(&mut lb, 0, 3 << 16, SYN | ACK, 2);
    let mut good = TcpFrame::from_client(
        conn.client,
        conn.port,
        ACK,
        options::nop_nop_ts(9, conn.echo),
    )
    .build();
    let mut bad = good.clone();
    let csum_at = 14 + 20 + 16;
    bad[csum_at] ^= 0x5a;
    let field = |f: &[u8]| u16::from_be_bytes([f[csum_at], f[csum_at + 1]]);
    // How wrong a checksum is, in ones'-complement arithmetic: bad - good.
    let error =
        |good: u16, bad: u16| cheetah_core::wire::checksum::fold((!good) as u32 + bad as u32);
    let error_in = error(field(&good), field(&bad));
    assert_eq!(lb.process(0, &mut good, 3), lb.process(0, &mut bad, 3));
    assert!(testkit::checksums_valid(&good));
    assert!(!testkit::checksums_valid(&bad));
    assert_eq!(
        error(field(&good), field(&bad)),
        error_in,
        "the error is carried through unchanged"
    );
}

#[test]
fn icmp_errors_follow_the_cookie_or_go_to_every_server_rate_limited() {
    for forwarding in [Forwarding::L2, Forwarding::Nat] {
        let mut config = testkit::config(Mode::Cheetah, forwarding, PolicyKind::RoundRobin, 3);
        config.vips[0].backend_port = Some(8080);
        let mut lb = Lb::new(config, 1);
        let mut conn = Conn::new(4);
        let Verdict::ToServer(server) = conn.syn(&mut lb, 0, 1) else {
            panic!()
        };
        let server_tsval = 0x0123_4567;
        let mut data = match forwarding {
            Forwarding::L2 => TcpFrame::from_server_l2(
                server.0,
                conn.client,
                conn.port,
                ACK,
                options::nop_nop_ts(server_tsval, 1),
            ),
            Forwarding::Nat => {
                let mut f = TcpFrame::from_server_nat(
                    server.0,
                    conn.client,
                    conn.port,
                    ACK,
                    options::nop_nop_ts(server_tsval, 1),
                );
                f.src_port = 8080;
                f
            }
        }
        .with_payload(&[0x61u8; 8])
        .build();
        assert_eq!(lb.process(0, &mut data, 2), Verdict::ToClient);

        // A router quotes the full header (with the cookie): routed to that server.
        let mut icmp = testkit::icmp_frag_needed(0x0a09_0001, &data, 20 + 32 + 8);
        assert_eq!(
            lb.process(0, &mut icmp, 3),
            Verdict::ToServer(server),
            "{forwarding:?}"
        );
        assert!(
            cheetah_core::wire::icmp::checksum_is_valid(&icmp[34..]),
            "{forwarding:?}"
        );
        let quoted = &icmp[42..];
        let quoted_tsval = u32::from_be_bytes(quoted[20 + 24..20 + 28].try_into().unwrap());
        assert_eq!(
            quoted_tsval, server_tsval,
            "quoted TSval restored to what the server sent"
        );
        if forwarding == Forwarding::L2 {
            assert!(
                cheetah_core::wire::tcp::checksum_is_valid(&quoted[20..], VIP, conn.client),
                "quoted TCP checksum follows the restored TSval"
            );
        }
        if forwarding == Forwarding::Nat {
            assert_eq!(
                &icmp[30..34],
                &testkit::server_dip(server.0).to_be_bytes(),
                "outer destination is the DIP"
            );
            assert_eq!(
                &quoted[12..16],
                &testkit::server_dip(server.0).to_be_bytes(),
                "quoted source is the DIP"
            );
            assert_eq!(
                &quoted[20..22],
                &8080u16.to_be_bytes(),
                "quoted source port is the backend port"
            );
            let ip_ok = cheetah_core::wire::checksum::fold(cheetah_core::wire::checksum::sum(
                &quoted[..20],
            )) == 0xffff;
            assert!(ip_ok, "quoted IP header checksum updated");
            // The whole segment is quoted here, so its TCP checksum must verify against the
            // translated addresses, with the restored TSval and the backend port.
            let dip = testkit::server_dip(server.0);
            assert!(
                cheetah_core::wire::tcp::checksum_is_valid(&quoted[20..], dip, conn.client),
                "quoted TCP checksum updated"
            );
        }

        // Only 8 bytes of TCP quoted: no cookie, copied to every server, 5 then rate-limited.
        let mut verdicts = Vec::new();
        for _ in 0..8 {
            let mut short = testkit::icmp_frag_needed(0x0a09_0001, &data, 28);
            verdicts.push(lb.process(0, &mut short, 4));
        }
        assert_eq!(
            verdicts
                .iter()
                .filter(|v| matches!(v, Verdict::ToAllServers { vip: 0 }))
                .count(),
            5
        );
        assert_eq!(lb.drops(DropReason::IcmpRateLimited), 3);
        let targets = lb.workers[0].copy_targets(0).to_vec();
        assert_eq!(targets.len(), 3);
        let original = testkit::icmp_frag_needed(0x0a09_0001, &data, 28);
        for t in targets {
            let mut copy = original.clone();
            lb.workers[0].prepare_copy(&mut copy, 0, t);
            assert_eq!(&copy[0..6], &testkit::server_mac(t.0));
            assert!(cheetah_core::wire::icmp::checksum_is_valid(&copy[34..]));
        }
    }
}

#[test]
fn traffic_that_is_not_for_a_vip_goes_to_the_host_and_unsupported_traffic_is_counted() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 2);
    let mut arp = testkit::arp_request(testkit::client_ip(1));
    assert_eq!(lb.process(0, &mut arp, 1), Verdict::Pass);
    let mut other = TcpFrame::from_client(testkit::client_ip(1), 1000, SYN, vec![]);
    other.dst_ip = 0x0a00_0001;
    assert_eq!(lb.process(0, &mut other.build(), 1), Verdict::Pass);
    let mut wrong_port = TcpFrame::from_client(testkit::client_ip(1), 1000, SYN, vec![]);
    wrong_port.dst_port = 443;
    assert_eq!(
        lb.process(0, &mut wrong_port.build(), 1),
        Verdict::Drop(DropReason::VipPortUnknown)
    );
    let mut fragment = TcpFrame::from_client(testkit::client_ip(1), 1000, SYN, vec![]).build();
    fragment[14 + 6] = 0x20; // more fragments
    assert_eq!(
        lb.process(0, &mut fragment, 1),
        Verdict::Drop(DropReason::UnsupportedFragment)
    );
    let mut udp = TcpFrame::from_client(testkit::client_ip(1), 1000, SYN, vec![]).build();
    udp[14 + 9] = 17;
    assert_eq!(
        lb.process(0, &mut udp, 1),
        Verdict::Drop(DropReason::UnsupportedUdp)
    );
    let mut spoofed =
        TcpFrame::from_server_l2(77, testkit::client_ip(1), 1000, ACK, vec![]).build();
    assert_eq!(
        lb.process(0, &mut spoofed, 1),
        Verdict::Drop(DropReason::UnknownServerSource)
    );
    let mut short = TcpFrame::from_client(testkit::client_ip(1), 1000, SYN, vec![]).build();
    short.truncate(14 + 20 + 10);
    short[14 + 3] = 30;
    assert_eq!(
        lb.process(0, &mut short, 1),
        Verdict::Drop(DropReason::TruncatedTcp)
    );
}

#[test]
fn every_prefix_of_real_frames_is_handled_without_panic() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 2);
    let frames = [
        TcpFrame::from_client(testkit::client_ip(1), 1000, SYN, options::apple_syn(1, 0)).build(),
        TcpFrame::from_client(
            testkit::client_ip(1),
            1000,
            ACK,
            options::nop_nop_ts_sack(1, 2),
        )
        .build(),
        TcpFrame::from_server_nat(
            1,
            testkit::client_ip(1),
            1000,
            SYN | ACK,
            options::odd_offset_ts(1, 2),
        )
        .build(),
    ];
    for f in &frames {
        for len in 0..=f.len() {
            let mut p = f[..len].to_vec();
            let _ = lb.process(0, &mut p, 1);
        }
    }
}

#[test]
fn a_removed_server_gets_no_packets_of_its_connections_without_timestamps() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
    let client = testkit::client_ip(7);
    let mut syn = TcpFrame::from_client(client, 40_000, SYN, options::windows_syn()).build();
    let Verdict::ToServer(server) = lb.process(0, &mut syn, NANOS_PER_SEC) else {
        panic!()
    };
    let ack = TcpFrame::from_client(client, 40_000, ACK, Vec::new()).build();
    assert_eq!(
        lb.process(0, &mut ack.clone(), 2 * NANOS_PER_SEC),
        Verdict::ToServer(server)
    );
    lb.plane.remove_server(server.0, 3 * NANOS_PER_SEC).unwrap();
    assert_eq!(
        lb.process(0, &mut ack.clone(), 4 * NANOS_PER_SEC),
        Verdict::Drop(DropReason::FallbackServerRemoved)
    );
    // An ICMP error about that connection is not routed to the removed server either.
    let quoted = TcpFrame::from_server_l2(server.0, client, 40_000, ACK, Vec::new()).build();
    let mut icmp = testkit::icmp_frag_needed(0x0a09_0001, &quoted, 48);
    assert_ne!(
        lb.process(0, &mut icmp, 5 * NANOS_PER_SEC),
        Verdict::ToServer(server)
    );
}

#[test]
fn nat_replies_keep_flowing_after_the_server_leaves_the_pool() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 3);
    let vip = format!("{}:{VIP_PORT}", std::net::Ipv4Addr::from(VIP));
    let reply = || {
        TcpFrame::from_server_nat(
            2,
            testkit::client_ip(7),
            40_000,
            ACK,
            options::nop_nop_ts(0x1234_0000, 1),
        )
        .build()
    };
    assert_eq!(
        lb.process(0, &mut reply(), NANOS_PER_SEC),
        Verdict::ToClient
    );
    lb.plane.leave_pool(&vip, 2).unwrap();
    assert_eq!(
        lb.process(0, &mut reply(), 2 * NANOS_PER_SEC),
        Verdict::ToClient,
        "existing connections keep going"
    );
    lb.plane.join_pool(&vip, 2, 1).unwrap();
    lb.plane.leave_pool(&vip, 2).unwrap();
    lb.plane.remove_server(2, 3 * NANOS_PER_SEC).unwrap();
    assert_eq!(
        lb.process(0, &mut reply(), 4 * NANOS_PER_SEC),
        Verdict::Drop(DropReason::ServerRemoved),
        "a removed server's late replies are dropped and counted, as in l2 mode"
    );
}

/// With 1,000 servers, one leaving must not remap the no-timestamp clients of the others:
/// the VIP's Maglev table keeps its size (it used to grow with the pool, past 655 servers a
/// new prime each time, which moved almost every flow).
#[test]
fn one_server_of_a_thousand_leaving_keeps_the_other_clients_without_timestamps_in_place() {
    let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 1000);
    let flows: Vec<(u32, u16)> = (0..20_000u32)
        .map(|n| (testkit::client_ip(n % 5000), 10_000 + (n / 5000) as u16))
        .collect();
    let place = |lb: &mut Lb, now: u64| -> Vec<ServerId> {
        flows
            .iter()
            .map(|&(client, port)| {
                let mut syn =
                    TcpFrame::from_client(client, port, SYN, options::windows_syn()).build();
                match lb.process(0, &mut syn, now) {
                    Verdict::ToServer(server) => server,
                    other => panic!("a SYN without timestamps: {other:?}"),
                }
            })
            .collect()
    };
    let before = place(&mut lb, NANOS_PER_SEC);
    lb.plane.drain_server(500).unwrap();
    lb.plane.remove_server(500, 2 * NANOS_PER_SEC).unwrap();
    let after = place(&mut lb, 3 * NANOS_PER_SEC);
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(old, new)| old != new && old.0 != 500)
        .count();
    assert!(
        moved < flows.len() / 100,
        "{moved} of {} flows of staying servers moved",
        flows.len()
    );
    assert!(after.iter().all(|s| s.0 != 500));
}

/// An operator drains and removes a server, then adds the same machine back (same DIP,
/// same MAC) while its old id is quarantined: the new id, not the quarantined one, owns the
/// machine's replies, so its first connections open at once.
#[test]
fn a_server_added_back_under_a_new_id_owns_its_replies_at_once() {
    for forwarding in [Forwarding::L2, Forwarding::Nat] {
        for requested in [None, Some(9)] {
            let mut lb = Lb::with(Mode::Cheetah, forwarding, PolicyKind::RoundRobin, 3);
            let vip = format!("{}:{VIP_PORT}", std::net::Ipv4Addr::from(VIP));
            lb.plane.drain_server(3).unwrap();
            lb.plane.remove_server(3, NANOS_PER_SEC).unwrap();
            let back = lb
                .plane
                .add_server(
                    cheetah_core::tables::ServerSpec {
                        id: requested,
                        dip: std::net::Ipv4Addr::from(testkit::server_dip(3)).into(),
                        mac: Some(cheetah_core::types::format_mac(&testkit::server_mac(3))),
                        vips: vec![(vip.clone(), 1)],
                        state: ConfiguredState::Active,
                    },
                    2 * NANOS_PER_SEC,
                )
                .unwrap();
            assert_ne!(back.0, 3, "the old id is quarantined");
            let label = format!("{forwarding:?}, id {requested:?} -> {}", back.0);
            let mut conn = Conn::new(5);
            // The replies come from the machine of server 3 (its MAC, or its DIP in nat).
            conn.server = Some(ServerId(3));
            let (verdict, reply) =
                conn.server_sends(&mut lb, 0, 0x0100_0000, SYN | ACK, 3 * NANOS_PER_SEC);
            assert_eq!(
                verdict,
                Verdict::ToClient,
                "{label}: the SYN-ACK reaches the client"
            );
            let cookie = tcp_ts::extract(testkit::timestamps(&reply).unwrap().0);
            assert_eq!(
                lb.plane
                    .shared()
                    .layout()
                    .decode(cookie, hash_of(conn.client, conn.port))
                    .server,
                back,
                "{label}: the cookie names the live server"
            );
            let (verdict, _) = conn.client_sends(&mut lb, 0, ACK, 4 * NANOS_PER_SEC);
            assert_eq!(verdict, Verdict::ToServer(back), "{label}");
            assert_eq!(lb.drops(DropReason::ServerRemoved), 0, "{label}");
        }
    }
}

/// The test-only fault switch: packets are still routed by their cookie, but the server gets
/// the cookie in TSecr instead of its own TSval, whether or not the fast path is asked for
/// (the fault keeps every packet on the general path, so the straight line never tests it).
#[test]
fn with_the_restore_switched_off_the_server_sees_the_cookie_in_tsecr() {
    for fast_path in [true, false] {
        let mut lb = Lb::with(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 2);
        lb.workers[0].set_restore_tsecr(false);
        lb.workers[0].set_fast_path(fast_path);
        let mut conn = Conn::new(3);
        let Verdict::ToServer(server) = conn.syn(&mut lb, 0, NANOS_PER_SEC) else {
            panic!()
        };
        let server_tsval = 0x0042_0007;
        conn.server_sends(&mut lb, 0, server_tsval, SYN | ACK, NANOS_PER_SEC);
        assert_ne!(conn.echo, server_tsval, "the client got a cookie");
        let (v, ack) = conn.client_sends(&mut lb, 0, ACK | PSH, NANOS_PER_SEC);
        assert_eq!(v, Verdict::ToServer(server));
        assert_eq!(
            testkit::timestamps(&ack).unwrap().1,
            conn.echo,
            "fast path {fast_path}: TSecr left as the client sent it"
        );
        assert_eq!(lb.workers[0].counters().get(Counter::FastPath), 0);
    }
}

/// Connections on a one-server pool whose closes the tests below drive by hand, through an
/// LB of two workers: l2 or NAT, with or without the straight line. Server segments
/// alternate between the workers as the tests say, as they may on a live LB (an RST after
/// a FIN often takes another queue).
struct Closes {
    lb: Lb,
    now: u64,
    forwarding: Forwarding,
    /// The server's timestamp clock, one tick per segment.
    server_clock: u32,
}

/// One connection of [`Closes`]: its client port, and the server's initial sequence number.
#[derive(Clone, Copy)]
struct Opened {
    port: u16,
    server_isn: u32,
}

impl Closes {
    /// Every configuration the close rule must hold in: l2 and NAT, fast path on and off.
    fn each(mut check: impl FnMut(&mut Closes)) {
        for forwarding in [Forwarding::L2, Forwarding::Nat] {
            for fast in [true, false] {
                let config = testkit::config(Mode::Cheetah, forwarding, PolicyKind::LeastLoaded, 1);
                let mut lb = Lb::new(config, 2);
                for worker in &mut lb.workers {
                    worker.set_fast_path(fast);
                }
                let mut closes = Closes {
                    lb,
                    now: NANOS_PER_SEC,
                    forwarding,
                    server_clock: 0x0005_0000,
                };
                check(&mut closes);
                assert_eq!(
                    closes.lb.counter(Counter::FastPath) > 0,
                    fast,
                    "{forwarding:?}: the straight line is taken exactly when it is on"
                );
            }
        }
    }

    /// A client opens a connection from `port` with initial sequence number `client_isn`;
    /// the server answers from `server_isn`.
    fn open(&mut self, port: u16, client_isn: u32, server_isn: u32) -> Opened {
        let client = testkit::client_ip(1);
        let mut syn = TcpFrame::from_client(client, port, SYN, options::linux_syn(1, 0));
        syn.seq = client_isn;
        self.now += NANOS_PER_MS;
        assert_eq!(
            self.lb.process(0, &mut syn.build(), self.now),
            Verdict::ToServer(ServerId(1))
        );
        let opened = Opened { port, server_isn };
        let mut syn_ack = self.segment(opened, SYN | ACK, server_isn, 0, true);
        syn_ack.ack = client_isn.wrapping_add(1);
        syn_ack.options = options::linux_syn(self.server_clock, 1);
        assert_eq!(
            self.lb.process(1, &mut syn_ack.build(), self.now),
            Verdict::ToClient
        );
        opened
    }

    /// A segment of `conn` from its server.
    fn segment(
        &mut self,
        conn: Opened,
        flags: u8,
        seq: u32,
        data: usize,
        stamped: bool,
    ) -> TcpFrame {
        self.server_clock += 1;
        let options = if stamped {
            options::nop_nop_ts(self.server_clock, 1)
        } else {
            Vec::new()
        };
        let client = testkit::client_ip(1);
        let frame = match self.forwarding {
            Forwarding::L2 => TcpFrame::from_server_l2(1, client, conn.port, flags, options),
            Forwarding::Nat => TcpFrame::from_server_nat(1, client, conn.port, flags, options),
        };
        TcpFrame { seq, ..frame }.with_payload(&vec![b'x'; data])
    }

    /// The server of `conn` sends a segment through `worker`, which forwards it.
    fn server_sends(
        &mut self,
        worker: usize,
        conn: Opened,
        flags: u8,
        seq: u32,
        data: usize,
        stamped: bool,
    ) {
        self.now += 200 * NANOS_PER_MS;
        let mut frame = self.segment(conn, flags, seq, data, stamped).build();
        assert_eq!(
            self.lb.process(worker, &mut frame, self.now),
            Verdict::ToClient
        );
    }

    /// The server's active count once both workers have merged.
    fn active(&mut self) -> u64 {
        self.now += MERGE_INTERVAL;
        for worker in &mut self.lb.workers {
            worker.tick(self.now);
        }
        self.lb
            .plane
            .shared()
            .loads
            .server(ServerId(1))
            .active_connections
    }

    fn what(&self) -> String {
        format!(
            "{:?}, fast path {}",
            self.forwarding,
            self.lb.counter(Counter::FastPath) > 0
        )
    }
}

/// What Linux sends for a segment of a connection it does not know, e.g. a client's
/// replay of an old segment whose cookie still names the server: an RST without options.
/// However often a client draws one, the count stays.
#[test]
fn a_server_rst_without_a_timestamp_is_not_a_close() {
    Closes::each(|c| {
        let a = c.open(40_001, 100, 7_000);
        c.open(40_002, 200, 9_000);
        assert_eq!(c.active(), 2);
        for n in 0..10 {
            // The replayed segment acknowledged 499 bytes of data: the RST carries that as its
            // sequence number; a replay without ACK draws an RST|ACK with sequence 0.
            let (flags, seq) = if n % 2 == 0 {
                (RST, a.server_isn + 500)
            } else {
                (RST | ACK, 0)
            };
            c.server_sends(n % 2, a, flags, seq, 0, false);
        }
        assert_eq!(c.active(), 2, "{}", c.what());
        assert_eq!(c.lb.counter(Counter::ResetsWithoutTimestamp), 10);
        assert_eq!(c.lb.counter(Counter::ServerCloses), 0);
    });
}

/// An RST that aborts a connection which negotiated timestamps carries one (Linux builds
/// it with the connection's options): it is a close, once.
#[test]
fn a_server_rst_with_a_timestamp_closes_its_connection_once() {
    Closes::each(|c| {
        let a = c.open(40_001, 100, 7_000);
        c.open(40_002, 200, 9_000);
        let abort_at = a.server_isn + 301;
        c.server_sends(0, a, RST | ACK, abort_at, 0, true);
        assert_eq!(c.active(), 1, "{}", c.what());
        c.server_sends(1, a, RST | ACK, abort_at, 0, true);
        assert_eq!(c.active(), 1, "the same RST again: {}", c.what());
        assert_eq!(c.lb.counter(Counter::ServerCloses), 1);
        assert_eq!(c.lb.counter(Counter::DuplicateCloses), 1);
    });
}

/// A client that never acknowledges the server's FIN draws a retransmission each RTO;
/// the connection still closes once. The last 300 bytes went with the FIN; after the
/// client acknowledged 100 of them the retransmission starts later, and once it has
/// them all the FIN goes alone: each time the FIN occupies the same sequence number.
#[test]
fn a_fin_retransmitted_three_times_closes_once() {
    Closes::each(|c| {
        let a = c.open(40_001, 100, 7_000);
        c.open(40_002, 200, 9_000);
        let fin_at = a.server_isn + 1 + 5_000;
        c.server_sends(0, a, FIN | ACK | PSH, fin_at - 300, 300, true);
        assert_eq!(c.active(), 1, "{}", c.what());
        c.server_sends(1, a, FIN | ACK | PSH, fin_at - 300, 300, true);
        c.server_sends(0, a, FIN | ACK | PSH, fin_at - 200, 200, true);
        c.server_sends(1, a, FIN | ACK, fin_at, 0, true);
        assert_eq!(c.active(), 1, "{}", c.what());
        assert_eq!(c.lb.counter(Counter::ServerCloses), 1);
        assert_eq!(c.lb.counter(Counter::DuplicateCloses), 3);
    });
}

/// A server that sent its FIN and then resets the connection (data arrived after its
/// close) closes it once: the RST is sent one past the FIN. With the connection's
/// timestamp or without (what Linux sends once the socket is gone), it is not counted again.
#[test]
fn a_fin_then_an_rst_close_once() {
    Closes::each(|c| {
        let a = c.open(40_001, 100, 7_000);
        c.open(40_002, 200, 9_000);
        let fin_at = a.server_isn + 101;
        c.server_sends(0, a, FIN | ACK, fin_at, 0, true);
        c.server_sends(1, a, RST | ACK, fin_at + 1, 0, true);
        c.server_sends(0, a, RST, fin_at + 1, 0, false);
        assert_eq!(c.active(), 1, "{}", c.what());
        assert_eq!(c.lb.counter(Counter::ServerCloses), 1);
        assert_eq!(c.lb.counter(Counter::DuplicateCloses), 1);
        assert_eq!(c.lb.counter(Counter::ResetsWithoutTimestamp), 1);
    });
}

/// A new connection on the same addresses and ports (another ISN on both sides) is
/// another connection: its close counts too, once.
#[test]
fn a_new_connection_on_the_same_ports_closes_again() {
    Closes::each(|c| {
        c.open(40_002, 200, 9_000);
        let first = c.open(40_001, 100, 7_000);
        assert_eq!(c.active(), 2);
        for worker in [0, 1] {
            c.server_sends(worker, first, FIN | ACK, first.server_isn + 101, 0, true);
        }
        assert_eq!(c.active(), 1, "{}", c.what());
        let second = c.open(40_001, 3_000_000, 1_500_000_000);
        assert_eq!(c.active(), 2, "{}", c.what());
        for worker in [1, 0] {
            c.server_sends(worker, second, FIN | ACK, second.server_isn + 42, 0, true);
        }
        assert_eq!(c.active(), 1, "{}", c.what());
        assert_eq!(c.lb.counter(Counter::ServerCloses), 2);
        assert_eq!(c.lb.counter(Counter::DuplicateCloses), 2);
    });
}
