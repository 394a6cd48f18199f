//! The generated in-memory trace: HTTP-like TCP conversations, as real endpoints send them.
//!
//! Why the trace is generated *through* a load balancer: a client's established packets
//! echo in TSecr the TSval it received, and in cheetah mode that TSval carries the cookie
//! the LB wrote. Made-up TSecr values would decode to garbage servers and measure the drop
//! path. So the conversation is played once through a warm-up [`Worker`], one packet at a
//! time: the SYN's verdict names the server that answers, server packets go through the LB
//! and the client echoes what came out, exactly like a real exchange. The trace keeps each
//! packet as its sender emitted it (before the LB), which is what the benchmark replays.
//!
//! Each flow: client SYN, server SYN-ACK, client ACK, client request, 1 to 4 server data
//! segments with a delayed client ACK every second segment, client FIN, server FIN, last
//! ACK. Up to `concurrency` flows are open at once and interleaved at random; option layouts
//! follow [`super::layouts`]. Everything is drawn from one seeded generator, and no draw
//! depends on the LB's answers, so the traces of the three modes carry the same flows,
//! layouts and sizes and differ only in server choice and timestamp values.

use anyhow::{bail, Context};
use cheetah_core::hash::FlowKey;
use cheetah_core::lb::{Ingress, Worker};
use cheetah_core::testkit::{self, TcpFrame};
use cheetah_core::wire::ip_proto;
use cheetah_core::wire::tcp::flags::{ACK, FIN, PSH, SYN};
use cheetah_core::{Nanos, ServerId, Verdict};

use super::layouts::{Layout, ESTABLISHED_MIX, SYN_ACK_MIX, SYN_MIX};
use super::rng::SplitMix64;

/// Shape of the trace.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    pub flows: usize,
    /// Most flows open at the same time.
    pub concurrency: usize,
    pub seed: u64,
    /// Share of flows whose client offers no timestamps (Windows' default), routed by the
    /// fallback table instead of a cookie.
    pub no_ts_share: f64,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            flows: 16_384,
            concurrency: 1_024,
            seed: 0x00c4_ee7a_2020,
            no_ts_share: 0.02,
        }
    }
}

/// Which side sent a packet and at which stage of its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    ClientSyn,
    ClientEstablished,
    ServerSynAck,
    ServerEstablished,
}

impl Role {
    pub fn is_client(self) -> bool {
        matches!(self, Role::ClientSyn | Role::ClientEstablished)
    }
}

/// One packet as its sender put it on the wire, before the LB.
#[derive(Clone, Debug)]
pub struct TracePacket {
    pub flow: u32,
    pub role: Role,
    /// Whether the flow's client offered timestamps (else it is a fallback-table flow).
    pub timestamps: bool,
    pub layout: Layout,
    /// The flow's server, as the warm-up LB placed the SYN.
    pub server: ServerId,
    /// Simulated time the packet reached the LB.
    pub at: Nanos,
    pub frame: Vec<u8>,
}

pub struct Trace {
    pub packets: Vec<TracePacket>,
    /// Connection id of each flow, by flow number.
    pub keys: Vec<FlowKey>,
    pub max_concurrent: usize,
    /// Simulated time after the last packet.
    pub end: Nanos,
}

/// Maximum segment size of the server's data segments.
const MSS: u64 = 1448;
const PAYLOAD: [u8; MSS as usize] = [b'x'; MSS as usize];
const MS: Nanos = 1_000_000;
/// Simulated time starts here, so timestamp clocks have ticked a while.
const START: Nanos = 3_600_000 * MS;

#[derive(Clone, Copy)]
struct Step {
    from_client: bool,
    flags: u8,
    payload: u16,
}

struct Flow {
    id: u32,
    client_ip: u32,
    client_port: u16,
    timestamps: bool,
    client_clock: u32,
    steps: Vec<Step>,
    next: usize,
    client_seq: u32,
    server_seq: u32,
    server: Option<ServerId>,
    /// The TSval the client last received (as the LB rewrote it): its next TSecr.
    client_echo: u32,
    /// The TSval the server last received: its next TSecr.
    server_echo: u32,
}

impl Flow {
    fn new(id: u32, config: &TraceConfig, rng: &mut SplitMix64) -> Self {
        let c = |flags| Step {
            from_client: true,
            flags,
            payload: 0,
        };
        let mut steps = vec![
            c(SYN),
            Step {
                from_client: false,
                flags: SYN | ACK,
                payload: 0,
            },
            c(ACK),
            Step {
                from_client: true,
                flags: PSH | ACK,
                payload: rng.range(80, 600) as u16,
            },
        ];
        let segments = rng.range(1, 4);
        for i in 0..segments {
            let last = i + 1 == segments;
            steps.push(Step {
                from_client: false,
                flags: if last { PSH | ACK } else { ACK },
                payload: if last { rng.range(100, MSS) } else { MSS } as u16,
            });
            if i % 2 == 1 || last {
                steps.push(c(ACK));
            }
        }
        steps.extend([
            c(FIN | ACK),
            Step {
                from_client: false,
                flags: FIN | ACK,
                payload: 0,
            },
            c(ACK),
        ]);
        Flow {
            id,
            client_ip: testkit::client_ip(id),
            client_port: rng.range(1024, 65535) as u16,
            timestamps: !rng.chance(config.no_ts_share),
            client_clock: rng.next_u32(),
            steps,
            next: 0,
            client_seq: rng.next_u32(),
            server_seq: rng.next_u32(),
            server: None,
            client_echo: 0,
            server_echo: 0,
        }
    }

    fn key(&self) -> FlowKey {
        FlowKey {
            client_ip: self.client_ip,
            vip_ip: testkit::VIP,
            client_port: self.client_port,
            vip_port: testkit::VIP_PORT,
            protocol: ip_proto::TCP,
        }
    }
}

/// Plays `config.flows` conversations through `lb` and returns what the endpoints sent.
///
/// Fails if the LB drops or misroutes anything: a trace built on drops would benchmark them.
pub fn generate(config: &TraceConfig, lb: &mut Worker) -> anyhow::Result<Trace> {
    let mut rng = SplitMix64::new(config.seed);
    let servers = lb.snapshot().servers.iter().count();
    // Each server's timestamp clock (1 ms ticks) has its own random origin.
    let server_clocks: Vec<u32> = (0..=servers).map(|_| rng.next_u32()).collect();
    let mut trace = Trace {
        packets: Vec::with_capacity(config.flows * 12),
        keys: Vec::with_capacity(config.flows),
        max_concurrent: 0,
        end: START,
    };
    let mut active: Vec<Flow> = Vec::with_capacity(config.concurrency);
    let mut started = 0usize;
    let mut now = START;
    while started < config.flows || !active.is_empty() {
        while active.len() < config.concurrency && started < config.flows {
            let flow = Flow::new(started as u32, config, &mut rng);
            trace.keys.push(flow.key());
            active.push(flow);
            started += 1;
        }
        trace.max_concurrent = trace.max_concurrent.max(active.len());
        let i = rng.below(active.len() as u64) as usize;
        now += rng.range(500, 3_500);
        let flow = &mut active[i];
        let step = flow.steps[flow.next];
        flow.next += 1;
        let packet = if step.from_client {
            client_packet(flow, step, now, &mut rng, lb)
        } else {
            server_packet(flow, step, now, &server_clocks, &mut rng, lb)
        }
        .with_context(|| format!("flow {} step {}", flow.id, flow.next))?;
        trace.packets.push(packet);
        if flow.next == flow.steps.len() {
            active.swap_remove(i);
        }
    }
    trace.end = now + MS;
    Ok(trace)
}

fn tick(clock: u32, now: Nanos) -> u32 {
    clock.wrapping_add((now / MS) as u32)
}

fn client_packet(
    flow: &mut Flow,
    step: Step,
    now: Nanos,
    rng: &mut SplitMix64,
    lb: &mut Worker,
) -> anyhow::Result<TracePacket> {
    let syn = step.flags & SYN != 0;
    let layout = match (flow.timestamps, syn) {
        (true, true) => rng.weighted(SYN_MIX),
        (true, false) => rng.weighted(ESTABLISHED_MIX),
        (false, true) => Layout::WindowsSyn,
        (false, false) => Layout::NoOptions,
    };
    let tsval = tick(flow.client_clock, now);
    let tsecr = if syn { 0 } else { flow.client_echo };
    let mut frame = TcpFrame::from_client(
        flow.client_ip,
        flow.client_port,
        step.flags,
        layout.options(tsval, tsecr),
    );
    frame.seq = flow.client_seq;
    frame.ack = if syn { 0 } else { flow.server_seq };
    frame.payload = PAYLOAD[..step.payload as usize].to_vec();
    flow.client_seq = flow
        .client_seq
        .wrapping_add(step.payload as u32 + (step.flags & (SYN | FIN) != 0) as u32);
    let frame = frame.build();
    let mut sent = frame.clone();
    let server = match lb.process(&mut sent, now, Ingress::ServerSide) {
        Verdict::ToServer(server) => server,
        other => bail!("client packet got {other:?}"),
    };
    match flow.server {
        None => flow.server = Some(server),
        Some(placed) if placed != server => {
            bail!("client packet went to {server:?}, the connection is on {placed:?}")
        }
        Some(_) => {}
    }
    if layout.has_timestamp() {
        flow.server_echo = tsval;
    }
    Ok(TracePacket {
        flow: flow.id,
        role: if syn {
            Role::ClientSyn
        } else {
            Role::ClientEstablished
        },
        timestamps: flow.timestamps,
        layout,
        server,
        at: now,
        frame,
    })
}

fn server_packet(
    flow: &mut Flow,
    step: Step,
    now: Nanos,
    clocks: &[u32],
    rng: &mut SplitMix64,
    lb: &mut Worker,
) -> anyhow::Result<TracePacket> {
    let syn = step.flags & SYN != 0;
    let server = flow.server.context("server packet before the SYN")?;
    let layout = match (flow.timestamps, syn) {
        (true, true) => rng.weighted(SYN_ACK_MIX),
        (true, false) => rng.weighted(ESTABLISHED_MIX),
        (false, true) => Layout::WindowsSyn,
        (false, false) => Layout::NoOptions,
    };
    let tsval = tick(clocks[server.index() % clocks.len()], now);
    let mut frame = TcpFrame::from_server_l2(
        server.0,
        flow.client_ip,
        flow.client_port,
        step.flags,
        layout.options(tsval, flow.server_echo),
    );
    frame.seq = flow.server_seq;
    frame.ack = flow.client_seq;
    frame.payload = PAYLOAD[..step.payload as usize].to_vec();
    flow.server_seq = flow
        .server_seq
        .wrapping_add(step.payload as u32 + (step.flags & (SYN | FIN) != 0) as u32);
    let frame = frame.build();
    let mut sent = frame.clone();
    match lb.process(&mut sent, now, Ingress::ServerSide) {
        Verdict::ToClient => {}
        other => bail!("server packet got {other:?}"),
    }
    if layout.has_timestamp() {
        flow.client_echo = testkit::timestamps(&sent)
            .context("the LB removed the timestamp")?
            .0;
    }
    Ok(TracePacket {
        flow: flow.id,
        role: if syn {
            Role::ServerSynAck
        } else {
            Role::ServerEstablished
        },
        timestamps: flow.timestamps,
        layout,
        server,
        at: now,
        frame,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::lab::Lab;
    use cheetah_core::config::Mode;
    use cheetah_core::policy::PolicyKind;
    use std::collections::HashMap;

    fn small(flows: usize, concurrency: usize) -> (TraceConfig, Trace) {
        let config = TraceConfig {
            flows,
            concurrency,
            ..TraceConfig::default()
        };
        let lab = Lab::new(Mode::Cheetah, PolicyKind::RoundRobin, 64).unwrap();
        let trace = generate(&config, &mut lab.worker()).unwrap();
        (config, trace)
    }

    #[test]
    fn every_flow_is_a_whole_conversation_within_the_concurrency_bound() {
        let (config, trace) = small(600, 50);
        assert_eq!(trace.keys.len(), 600);
        assert_eq!(trace.max_concurrent, 50);
        let mut per_flow: HashMap<u32, Vec<Role>> = HashMap::new();
        for p in &trace.packets {
            per_flow.entry(p.flow).or_default().push(p.role);
        }
        assert_eq!(per_flow.len(), config.flows);
        for roles in per_flow.values() {
            assert_eq!(roles[0], Role::ClientSyn);
            assert_eq!(roles[1], Role::ServerSynAck);
            assert!((9..=13).contains(&roles.len()), "{roles:?}");
            assert_eq!(roles.iter().filter(|r| **r == Role::ClientSyn).count(), 1);
        }
        // Open flows at any point: first packet seen .. last packet seen.
        let mut first_last: HashMap<u32, (usize, usize)> = HashMap::new();
        for (i, p) in trace.packets.iter().enumerate() {
            first_last.entry(p.flow).or_insert((i, i)).1 = i;
        }
        let mut open = vec![0i32; trace.packets.len() + 1];
        for (first, last) in first_last.values() {
            open[*first] += 1;
            open[*last + 1] -= 1;
        }
        let mut now = 0;
        let peak = open.iter().map(|d| {
            now += d;
            now
        });
        assert!(peak.max().unwrap() <= 50);
    }

    #[test]
    fn layouts_follow_the_mixes() {
        let (_, trace) = small(3_000, 200);
        let share = |role: Role, layout: Layout| {
            let of_role: Vec<_> = trace
                .packets
                .iter()
                .filter(|p| p.role == role && p.timestamps)
                .collect();
            of_role.iter().filter(|p| p.layout == layout).count() as f64 / of_role.len() as f64
        };
        let close = |got: f64, want: f64, tolerance: f64| {
            assert!((got - want).abs() <= tolerance, "{got} vs {want}")
        };
        close(share(Role::ClientSyn, Layout::LinuxSyn), 0.505, 0.04);
        close(share(Role::ClientSyn, Layout::AppleSyn), 0.44, 0.04);
        close(share(Role::ServerSynAck, Layout::LinuxSyn), 0.90, 0.03);
        close(
            share(Role::ClientEstablished, Layout::NopNopTs),
            0.9845,
            0.01,
        );
        close(
            share(Role::ServerEstablished, Layout::NopNopTsSack),
            0.015,
            0.01,
        );
        let no_ts = trace.packets.iter().filter(|p| !p.timestamps).count() as f64;
        close(no_ts / trace.packets.len() as f64, 0.02, 0.015);
    }

    /// Same seed, same flows and layouts, whatever the mode: the modes' rows compare like
    /// with like.
    #[test]
    fn traces_of_different_modes_carry_the_same_flows() {
        let config = TraceConfig {
            flows: 200,
            concurrency: 20,
            ..TraceConfig::default()
        };
        let a = generate(
            &config,
            &mut Lab::new(Mode::Cheetah, PolicyKind::RoundRobin, 64)
                .unwrap()
                .worker(),
        )
        .unwrap();
        let b = generate(
            &config,
            &mut Lab::new(Mode::Hash, PolicyKind::RoundRobin, 64)
                .unwrap()
                .worker(),
        )
        .unwrap();
        assert_eq!(a.packets.len(), b.packets.len());
        for (x, y) in a.packets.iter().zip(&b.packets) {
            assert_eq!((x.flow, x.role, x.layout), (y.flow, y.role, y.layout));
            assert_eq!(x.frame.len(), y.frame.len());
        }
    }
}
