//! Connections that carry no cookie: clients without TCP timestamps, servers that decline
//! them, and client segments without ACK (whose TSecr echoes nothing, RFC 7323).
//!
//! A connection's packets do not all reach the same worker: its SYN-ACK comes in on the
//! servers' interface under another queue's hash (in NAT mode from another address, so even
//! symmetric RSS cannot put it with the client's packets), and a client's packets may move
//! to another queue mid-connection (Linux draws a new transmit hash after a retransmission
//! timeout, an operator re-spreads RSS). So what one worker learns about a connection
//! without a cookie must hold on every worker: the LB's fallback table is one per process.

use std::sync::Arc;

use cheetah_core::config::{ConfiguredState, Forwarding, LbConfig, Mode};
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::lb::{Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::{ControlPlane, ServerSpec};
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::types::NANOS_PER_SEC;
use cheetah_core::wire::tcp::flags::{ACK, FIN, PSH, RST, SYN};
use cheetah_core::{DropReason, ServerId, Verdict};

const SECRET: Secret = Secret([0x5a; 16]);
const SERVERS: u16 = 6;
/// Connections per test: enough that Maglev moves several of them on a pool change.
const CONNECTIONS: u32 = 120;

struct Lb {
    plane: ControlPlane,
    workers: Vec<Worker>,
    forwarding: Forwarding,
}

impl Lb {
    /// `workers` workers sharing the control plane's one `LbShared`, round-robin placing
    /// connections that offer timestamps.
    fn new(forwarding: Forwarding, workers: usize) -> Self {
        let config = testkit::config(Mode::Cheetah, forwarding, PolicyKind::RoundRobin, SERVERS);
        Self::with_config(config, workers)
    }

    fn with_config(config: LbConfig, workers: usize) -> Self {
        let plane = ControlPlane::new(&config, &SECRET).unwrap();
        let workers = (0..workers)
            .map(|i| {
                Worker::new(
                    Arc::clone(plane.shared()),
                    WorkerConfig::new(i, workers, &config),
                )
            })
            .collect();
        Lb {
            plane,
            workers,
            forwarding: config.forwarding,
        }
    }

    fn process(&mut self, worker: usize, frame: &[u8], now: u64) -> Verdict {
        let mut frame = frame.to_vec();
        self.workers[worker].process(&mut frame, now, Ingress::ServerSide)
    }

    fn counter(&self, c: Counter) -> u64 {
        self.workers.iter().map(|w| w.counters().get(c)).sum()
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.workers.iter().map(|w| w.counters().drops(r)).sum()
    }

    /// Server `server`'s answer to client `n` (l2: from its MAC; NAT: from its address).
    fn server_sends(&self, server: ServerId, n: u32, flags: u8, options: Vec<u8>) -> Vec<u8> {
        let (client, port) = client(n);
        match self.forwarding {
            Forwarding::L2 => TcpFrame::from_server_l2(server.0, client, port, flags, options),
            Forwarding::Nat => TcpFrame::from_server_nat(server.0, client, port, flags, options),
        }
        .build()
    }

    /// Where the VIP's Maglev table sends client `n` now.
    fn maglev(&self, n: u32) -> ServerId {
        let (client, port) = client(n);
        let hash = FlowHasher::new(&SECRET).hash(&FlowKey::tcp(client, port, VIP, VIP_PORT));
        let snapshot = self.plane.shared().snapshot.load();
        snapshot.vips[0].pool.maglev.lookup(hash).unwrap()
    }

    /// A pool change under Maglev: server 7 joins, server 2 is drained.
    fn change_pool(&mut self, now: u64) {
        let vip = format!("{}:{VIP_PORT}", std::net::Ipv4Addr::from(VIP));
        self.plane
            .add_server(
                ServerSpec {
                    id: Some(7),
                    dip: std::net::Ipv4Addr::from(testkit::server_dip(7)).into(),
                    mac: Some(cheetah_core::types::format_mac(&testkit::server_mac(7))),
                    vips: vec![(vip, 1)],
                    state: ConfiguredState::Active,
                },
                now,
            )
            .unwrap();
        self.plane.drain_server(2).unwrap();
    }
}

fn client(n: u32) -> (u32, u16) {
    (testkit::client_ip(n), 20_000 + n as u16)
}

fn from_client(n: u32, flags: u8, options: Vec<u8>) -> Vec<u8> {
    let (client, port) = client(n);
    TcpFrame::from_client(client, port, flags, options)
        .with_payload(b"GET / HTTP/1.1\r\n\r\n")
        .build()
}

const FORWARDINGS: [Forwarding; 2] = [Forwarding::L2, Forwarding::Nat];

/// A client without timestamps: its SYN on worker 0 (placed by Maglev), the server's
/// SYN-ACK on worker 1, then a pool change that moves Maglev. The client's later packets
/// reach the server that answered on either worker, and so do they when a connection's
/// SYN and SYN-ACK both went through worker 0 and its packets then move to worker 1 (a
/// worker that saw nothing of it; with one table per worker it asked Maglev, which has
/// moved). An ICMP error about such a connection, quoting no timestamp, arriving on the
/// other worker goes to that server too, not to every server.
#[test]
fn clients_without_timestamps_keep_their_server_on_every_worker() {
    for forwarding in FORWARDINGS {
        let mut lb = Lb::new(forwarding, 2);
        let second = NANOS_PER_SEC;
        let mut placed = Vec::new();
        for n in 0..CONNECTIONS {
            let Verdict::ToServer(server) =
                lb.process(0, &from_client(n, SYN, options::windows_syn()), second)
            else {
                panic!("{forwarding:?}: SYN {n} not forwarded");
            };
            assert_eq!(
                server,
                lb.maglev(n),
                "a SYN without timestamps takes Maglev"
            );
            // Half the SYN-ACKs come in on the other worker, half on the SYN's.
            let synack_worker = (n % 2) as usize;
            let synack = lb.server_sends(server, n, SYN | ACK, options::windows_syn());
            assert_eq!(
                lb.process(synack_worker, &synack, 2 * second),
                Verdict::ToClient
            );
            placed.push((n, server, synack_worker));
        }
        lb.change_pool(3 * second);
        let moved = placed
            .iter()
            .filter(|(n, server, _)| lb.maglev(*n) != *server)
            .count();
        assert!(
            moved >= 10,
            "{forwarding:?}: the pool change moved only {moved} of Maglev's picks"
        );
        for &(n, server, synack_worker) in &placed {
            // Packets on the worker that saw the SYN-ACK, then on the other one; the
            // connections whose SYN-ACK came on the SYN's worker end on a worker that saw
            // neither.
            for worker in [synack_worker, 1 - synack_worker] {
                assert_eq!(
                    lb.process(worker, &from_client(n, ACK | PSH, Vec::new()), 4 * second),
                    Verdict::ToServer(server),
                    "{forwarding:?}: client {n} on worker {worker}"
                );
            }
            // What the client was sent: from the VIP, in NAT mode too.
            let (client_ip, port) = client(n);
            let quoted =
                TcpFrame::from_server_l2(server.0, client_ip, port, ACK, Vec::new()).build();
            let icmp = testkit::icmp_frag_needed(0x0a09_0001, &quoted, 28);
            assert_eq!(
                lb.process(1 - synack_worker, &icmp, 5 * second),
                Verdict::ToServer(server),
                "{forwarding:?}: ICMP error about client {n}"
            );
        }
        assert_eq!(
            lb.counter(Counter::FallbackHits),
            2 * CONNECTIONS as u64,
            "{forwarding:?}"
        );
        assert_eq!(lb.counter(Counter::FallbackMisses), 0, "{forwarding:?}");
        assert_eq!(
            lb.counter(Counter::IcmpRoutedByFallback),
            CONNECTIONS as u64,
            "{forwarding:?}"
        );
    }
}

/// Opens [`CONNECTIONS`] connections whose client offers timestamps, so round-robin places
/// the SYN (on worker 0), and whose server declines them: its SYN-ACK without a timestamp
/// passes worker 1. Returns (connection, server).
fn open_with_timestamps_declined(
    lb: &mut Lb,
    forwarding: Forwarding,
    second: u64,
) -> Vec<(u32, ServerId)> {
    (0..CONNECTIONS)
        .map(|n| {
            let Verdict::ToServer(server) =
                lb.process(0, &from_client(n, SYN, options::linux_syn(7, 0)), second)
            else {
                panic!("{forwarding:?}: SYN {n} not forwarded");
            };
            let synack = lb.server_sends(server, n, SYN | ACK, options::windows_syn());
            assert_eq!(lb.process(1, &synack, 2 * second), Verdict::ToClient);
            (n, server)
        })
        .collect()
}

/// The client offered timestamps, so round-robin placed its SYN, but the server declined
/// them: the SYN-ACK without a timestamp, on the servers' worker, names the server, and the
/// client's packets (no timestamps now, on the SYN's worker or the other) must reach it
/// after a pool change. Maglev alone would send most of them elsewhere.
#[test]
fn a_server_that_declines_timestamps_keeps_its_connections_on_every_worker() {
    for forwarding in FORWARDINGS {
        let mut lb = Lb::new(forwarding, 2);
        let second = NANOS_PER_SEC;
        let placed = open_with_timestamps_declined(&mut lb, forwarding, second);
        assert_eq!(
            lb.counter(Counter::FallbackLearnedFromServer),
            CONNECTIONS as u64
        );
        lb.change_pool(3 * second);
        let elsewhere = placed
            .iter()
            .filter(|(n, server)| lb.maglev(*n) != *server)
            .count();
        assert!(
            elsewhere >= CONNECTIONS as usize / 2,
            "{forwarding:?}: Maglev agrees with round-robin on {} of {CONNECTIONS}",
            CONNECTIONS as usize - elsewhere
        );
        for &(n, server) in &placed {
            for worker in [0, 1] {
                for flags in [ACK, ACK | PSH, ACK | FIN] {
                    assert_eq!(
                        lb.process(worker, &from_client(n, flags, Vec::new()), 4 * second),
                        Verdict::ToServer(server),
                        "{forwarding:?}: client {n} on worker {worker}, flags {flags:#04x}"
                    );
                }
            }
        }
        assert_eq!(lb.counter(Counter::FallbackMisses), 0, "{forwarding:?}");
    }
}

/// A client's segment without ACK other than a SYN (a RST, mostly) carries no echo in
/// TSecr (RFC 7323: TSecr is valid only with ACK; Linux sends 0). It is routed like a
/// segment without timestamps, by the fallback table or else by Maglev, with TSecr left as
/// it is, never dropped as a bad cookie. Both the straight line and the general pipeline.
#[test]
fn a_client_segment_without_ack_is_routed_without_its_tsecr() {
    for forwarding in FORWARDINGS {
        for fast_path in [true, false] {
            let mut lb = Lb::new(forwarding, 2);
            for worker in &mut lb.workers {
                worker.set_fast_path(fast_path);
            }
            let second = NANOS_PER_SEC;
            let mut checked = 0;
            for n in 0..CONNECTIONS {
                // A connection with timestamps, established through the LB.
                let Verdict::ToServer(server) =
                    lb.process(0, &from_client(n, SYN, options::linux_syn(7, 0)), second)
                else {
                    panic!()
                };
                let synack = lb.server_sends(server, n, SYN | ACK, options::linux_syn(99 << 16, 7));
                let mut out = synack.clone();
                assert_eq!(
                    lb.workers[1].process(&mut out, 2 * second, Ingress::ServerSide),
                    Verdict::ToClient
                );
                let (cookie_tsval, _) = testkit::timestamps(&out).unwrap();
                // The echo of that cookie with ACK is routed by it, as always.
                assert_eq!(
                    lb.process(
                        0,
                        &from_client(n, ACK, options::nop_nop_ts(8, cookie_tsval)),
                        2 * second
                    ),
                    Verdict::ToServer(server)
                );
                let maglev = lb.maglev(n);
                // TSecr 0 (what Linux sends without ACK), garbage, and the connection's own
                // cookie: without ACK none of them is read.
                let garbage = 0xdead_0000 | n;
                for tsecr in [0, garbage, cookie_tsval] {
                    for flags in [RST, FIN, 0] {
                        let segment = from_client(n, flags, options::nop_nop_ts(9, tsecr));
                        let mut out = segment.clone();
                        let verdict = lb.workers[(n % 2) as usize].process(
                            &mut out,
                            3 * second,
                            Ingress::ServerSide,
                        );
                        assert_eq!(
                            verdict,
                            Verdict::ToServer(maglev),
                            "{forwarding:?} fast={fast_path}: client {n}, flags {flags:#04x}, TSecr {tsecr:#010x}"
                        );
                        assert_eq!(
                            testkit::timestamps(&out).unwrap().1,
                            tsecr,
                            "TSecr without ACK is left as it is"
                        );
                        assert!(testkit::checksums_valid(&out));
                        checked += 1;
                    }
                }
            }
            assert_eq!(checked, 9 * CONNECTIONS);
            for reason in cheetah_core::DropReason::ALL {
                assert_eq!(
                    lb.drops(*reason),
                    0,
                    "{forwarding:?} fast={fast_path}: {}",
                    reason.name()
                );
            }
        }
    }
}

/// A client RST without ACK of a connection the fallback table knows (its server declined
/// timestamps) goes to that server, whatever TSecr says, even after Maglev moved.
#[test]
fn a_client_rst_without_ack_follows_the_fallback_table() {
    for forwarding in FORWARDINGS {
        let mut lb = Lb::new(forwarding, 2);
        let second = NANOS_PER_SEC;
        let placed = open_with_timestamps_declined(&mut lb, forwarding, second);
        lb.change_pool(3 * second);
        for &(n, server) in &placed {
            for tsecr in [0, 0xbad0_0000 | n] {
                let rst = from_client(n, RST, options::nop_nop_ts(9, tsecr));
                assert_eq!(
                    lb.process((n % 2) as usize, &rst, 4 * second),
                    Verdict::ToServer(server),
                    "{forwarding:?}: client {n}, TSecr {tsecr:#010x}"
                );
            }
        }
        assert_eq!(
            lb.counter(Counter::FallbackHits),
            2 * CONNECTIONS as u64,
            "{forwarding:?}"
        );
    }
}
