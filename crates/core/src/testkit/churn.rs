//! A churn scenario in memory: many open connections while the pool changes, each packet
//! checked against the server its connection started on. The core-level twin of the
//! testbed's churn runs, used by tests and by the demo to show what cheetah prevents.

use std::net::Ipv4Addr;

use super::{client_ip, config, options, server_mac, TcpFrame, VIP, VIP_PORT};
use crate::config::{ConfiguredState, Forwarding, Mode};
use crate::hash::Secret;
use crate::lb::{Ingress, Worker, WorkerConfig};
use crate::policy::PolicyKind;
use crate::tables::{ControlPlane, ServerSpec};
use crate::types::{format_mac, ServerId, NANOS_PER_MS, NANOS_PER_SEC};
use crate::verdict::Verdict;
use crate::wire::tcp::flags::{ACK, PSH, SYN};

/// What happened to the connections of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChurnReport {
    pub mode: Mode,
    pub connections: usize,
    /// Client packets sent after the handshake.
    pub packets: usize,
    /// Client packets that reached another server than their connection's.
    pub misrouted_packets: usize,
    /// Connections with at least one misrouted packet: broken.
    pub broken_connections: usize,
    /// Client packets dropped by the LB.
    pub dropped_packets: usize,
    /// The pool changes applied, in order.
    pub changes: Vec<String>,
}

struct Conn {
    client: u32,
    port: u16,
    server: Option<ServerId>,
    echo: u32,
    clock: u32,
    broken: bool,
}

/// Opens `connections` connections over 8 servers (rr), then runs six rounds of one client
/// packet and one server reply per connection, on two workers, changing the pool between
/// rounds: a server added, one drained, one taken out of the pool, the policy changed to
/// pow2. Deterministic.
pub fn run(mode: Mode, connections: usize) -> ChurnReport {
    let cfg = config(mode, Forwarding::L2, PolicyKind::RoundRobin, 8);
    let mut plane = ControlPlane::new(&cfg, &Secret([0x42; 16])).expect("valid config");
    let mut workers: Vec<Worker> = (0..2)
        .map(|i| Worker::new(plane.shared().clone(), WorkerConfig::new(i, 2, &cfg)))
        .collect();
    let vip = format!("{}:{VIP_PORT}", Ipv4Addr::from(VIP));
    let mut conns: Vec<Conn> = (0..connections as u32)
        .map(|n| Conn {
            client: client_ip(n),
            port: 20_000 + (n % 40_000) as u16,
            server: None,
            echo: 0,
            clock: 7,
            broken: false,
        })
        .collect();
    let mut now = NANOS_PER_SEC;
    let mut report = ChurnReport {
        mode,
        connections,
        packets: 0,
        misrouted_packets: 0,
        broken_connections: 0,
        dropped_packets: 0,
        changes: Vec::new(),
    };
    for (i, c) in conns.iter_mut().enumerate() {
        let mut syn =
            TcpFrame::from_client(c.client, c.port, SYN, options::linux_syn(c.clock, 0)).build();
        if let Verdict::ToServer(s) = workers[i % 2].process(&mut syn, now, Ingress::ServerSide) {
            c.server = Some(s);
            server_reply(
                &mut workers[(i + 1) % 2],
                c,
                5_000_000 + i as u32,
                SYN | ACK,
                now,
            );
        }
        now += NANOS_PER_MS;
    }
    for round in 0..6 {
        let change = match round {
            1 => {
                let spec = ServerSpec {
                    id: Some(20),
                    dip: "10.1.0.20".parse().unwrap(),
                    mac: Some(format_mac(&server_mac(20))),
                    vips: vec![(vip.clone(), 1)],
                    state: ConfiguredState::Active,
                };
                plane
                    .add_server(spec, now)
                    .map(|_| "server 20 added".to_string())
            }
            2 => plane
                .drain_server(3)
                .map(|_| "server 3 drained".to_string()),
            3 => plane
                .leave_pool(&vip, 5)
                .map(|_| "server 5 left the pool".to_string()),
            4 => plane
                .set_policy(&vip, PolicyKind::PowerOfTwo, None)
                .map(|_| "policy rr -> pow2".to_string()),
            _ => Ok(String::new()),
        };
        match change {
            Ok(text) if !text.is_empty() => report.changes.push(text),
            Ok(_) => {}
            Err(e) => panic!("churn change refused: {e}"),
        }
        for (i, c) in conns.iter_mut().enumerate() {
            let Some(server) = c.server else { continue };
            c.clock += 1;
            let mut data = TcpFrame::from_client(
                c.client,
                c.port,
                ACK | PSH,
                options::nop_nop_ts(c.clock, c.echo),
            )
            .with_payload(b"GET / HTTP/1.1\r\n\r\n")
            .build();
            report.packets += 1;
            match workers[(i + round) % 2].process(&mut data, now, Ingress::ServerSide) {
                Verdict::ToServer(s) if s == server => {}
                Verdict::Drop(_) => report.dropped_packets += 1,
                _ => {
                    report.misrouted_packets += 1;
                    c.broken = true;
                }
            }
            server_reply(
                &mut workers[(i + round + 1) % 2],
                c,
                5_000_000 + i as u32 + round as u32,
                ACK,
                now,
            );
            now += NANOS_PER_MS / 10;
        }
    }
    report.broken_connections = conns.iter().filter(|c| c.broken).count();
    report
}

/// The connection's own server answers; the client will echo the TSval it receives.
fn server_reply(worker: &mut Worker, c: &mut Conn, tsval: u32, flags: u8, now: u64) {
    let server = c.server.expect("placed").0;
    let opts = if flags & SYN != 0 {
        options::linux_syn(tsval, c.clock)
    } else {
        options::nop_nop_ts(tsval, c.clock)
    };
    let mut reply = TcpFrame::from_server_l2(server, c.client, c.port, flags, opts).build();
    if worker.process(&mut reply, now, Ingress::ServerSide) == Verdict::ToClient {
        if let Some((tsval, _)) = super::timestamps(&reply) {
            c.echo = tsval;
        }
    }
}
