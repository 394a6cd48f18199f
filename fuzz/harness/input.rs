//! The fuzz input: two bytes that select a config, then records (packets, control
//! actions, load reports, clock imports) until the input ends.
//!
//! ```text
//! byte 0   config:  bits 0-1 mode (0 cheetah, 1 hash, 2 maglev, 3 cheetah)
//!                   bit 2    forwarding (0 l2, 1 nat)
//!                   bits 3-5 policy of VIP 10.0.0.100:80 (index into PolicyKind::ALL)
//!                   bit 6    extra VIPs: 10.0.0.100:443 (backend port 8443) and an IPv6 VIP
//!                   bit 7    two workers sharing one LbShared (else one)
//! byte 1   servers: bits 0-1 servers 1..=n+1 in the config; bit 2 server 2 starts draining
//! then records until the input ends:
//!   tag 0x00..=0x7f  packet: bit 0 worker, bits 1-3 time step (STEPS), bits 4-6 all set:
//!                    it arrived on a client-side port (else server side), then a 2-byte
//!                    big-endian length and that many bytes (fewer if the input ends)
//!   tag 0x80..=0xbf  control action (ACTIONS[tag & 7]) on server id (tag >> 3) & 7
//!   tag 0xc0..=0xff  server id tag & 7, then a 2-byte big-endian value v; bits 3-5 say
//!                    what it is: 1 reported load v/100, 2 reported connections v, 3 both,
//!                    anything else a clock import (TSval v << 16 at the current time)
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cheetah_core::config::{Forwarding, LbConfig, Mode, VipConfig};
use cheetah_core::lb::Ingress;
use cheetah_core::policy::{PolicyKind, ReportedLoad};
use cheetah_core::testkit;
use cheetah_core::types::{Nanos, ServerId, NANOS_PER_MS, NANOS_PER_SEC};

/// Time steps a packet record can take: same instant is not allowed (time is strictly
/// increasing), then sub-ms, a merge interval, a second, a keepalive, one MSB period,
/// the quarantine, and a long idle gap.
pub const STEPS: [Nanos; 8] = [
    1,
    50_000,
    10 * NANOS_PER_MS,
    NANOS_PER_SEC,
    25 * NANOS_PER_SEC,
    66 * NANOS_PER_SEC,
    601 * NANOS_PER_SEC,
    3_600 * NANOS_PER_SEC,
];

/// Control actions a record can apply (errors from the control plane are fine: a refused
/// change must leave the tables as they were, which the next packets then exercise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Drain,
    Activate,
    Remove,
    Add,
    SetPolicy,
    LeavePool,
    JoinPool,
    Expire,
}

pub const ACTIONS: [Action; 8] = [
    Action::Drain,
    Action::Activate,
    Action::Remove,
    Action::Add,
    Action::SetPolicy,
    Action::LeavePool,
    Action::JoinPool,
    Action::Expire,
];

/// Bits 4-6 of a packet's tag, all set: the packet arrived on a client-side port. All three,
/// so that inputs from before ingress was in the format mostly keep their meaning.
const CLIENT_SIDE: u8 = 0x70;

/// Bounds that keep one input fast: control changes rebuild Maglev tables.
pub const MAX_RECORDS: usize = 64;
pub const MAX_CONTROL_ACTIONS: usize = 6;
/// Packets above this are truncated (jumbo frames add nothing the parser has not seen).
pub const MAX_PACKET: usize = 2048;

pub const IPV6_VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
pub const SECOND_VIP_PORT: u16 = 443;
pub const SECOND_BACKEND_PORT: u16 = 8443;

/// What byte 0 and byte 1 select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    pub mode: Mode,
    pub forwarding: Forwarding,
    pub policy: PolicyKind,
    pub extra_vips: bool,
    pub two_workers: bool,
    pub servers: u16,
    pub drain_two: bool,
}

impl Setup {
    pub fn decode(config: u8, servers: u8) -> Self {
        Setup {
            mode: [Mode::Cheetah, Mode::Hash, Mode::Maglev, Mode::Cheetah][(config & 3) as usize],
            forwarding: if config & 4 != 0 {
                Forwarding::Nat
            } else {
                Forwarding::L2
            },
            policy: PolicyKind::ALL[((config >> 3) & 7) as usize],
            extra_vips: config & 0x40 != 0,
            two_workers: config & 0x80 != 0,
            servers: u16::from(servers & 3) + 1,
            drain_two: servers & 4 != 0,
        }
    }

    /// The inverse of [`decode`](Self::decode), for seeds and regression inputs.
    pub fn encode(&self) -> [u8; 2] {
        let mode = match self.mode {
            Mode::Cheetah => 0,
            Mode::Hash => 1,
            Mode::Maglev => 2,
        };
        let policy = PolicyKind::ALL
            .iter()
            .position(|p| *p == self.policy)
            .unwrap() as u8;
        let config = mode
            | (u8::from(self.forwarding == Forwarding::Nat) << 2)
            | (policy << 3)
            | (u8::from(self.extra_vips) << 6)
            | (u8::from(self.two_workers) << 7);
        [
            config,
            (self.servers.clamp(1, 4) - 1) as u8 | (u8::from(self.drain_two) << 2),
        ]
    }

    pub fn new(mode: Mode, forwarding: Forwarding) -> Self {
        Setup {
            mode,
            forwarding,
            policy: PolicyKind::RoundRobin,
            extra_vips: false,
            two_workers: false,
            servers: 3,
            drain_two: false,
        }
    }

    pub fn config(&self) -> LbConfig {
        let mut config = testkit::config(self.mode, self.forwarding, self.policy, self.servers);
        if self.drain_two && self.servers >= 2 {
            config.servers[1].state = cheetah_core::config::ConfiguredState::Draining;
        }
        if self.extra_vips {
            config.vips.push(VipConfig {
                address: IpAddr::V4(Ipv4Addr::from(testkit::VIP)),
                port: SECOND_VIP_PORT,
                policy: PolicyKind::WeightedRoundRobin,
                load_metric: None,
                backend_port: Some(SECOND_BACKEND_PORT),
                servers: (1..=self.servers).rev().collect(),
                weights: [("1".to_string(), 3)].into_iter().collect(),
                health: Default::default(),
            });
            config.vips.push(VipConfig {
                address: IpAddr::V6(IPV6_VIP),
                port: 80,
                policy: PolicyKind::RoundRobin,
                load_metric: None,
                backend_port: Some(9080),
                servers: (1..=self.servers).collect(),
                weights: Default::default(),
                health: Default::default(),
            });
        }
        config
    }
}

/// Appends records to an input, for seeds and regression tests.
#[derive(Clone, Debug)]
pub struct InputBuilder {
    bytes: Vec<u8>,
}

impl InputBuilder {
    pub fn new(setup: Setup) -> Self {
        InputBuilder {
            bytes: setup.encode().to_vec(),
        }
    }

    /// A packet for `worker` (0 or 1) after time step `step` (index into [`STEPS`]),
    /// arriving on the server side.
    pub fn packet(self, worker: u8, step: u8, packet: &[u8]) -> Self {
        self.packet_from(Ingress::ServerSide, worker, step, packet)
    }

    /// [`packet`](Self::packet), arriving on the `ingress` side.
    pub fn packet_from(mut self, ingress: Ingress, worker: u8, step: u8, packet: &[u8]) -> Self {
        assert!(packet.len() <= u16::MAX as usize);
        let side = match ingress {
            Ingress::ClientSide => CLIENT_SIDE,
            Ingress::ServerSide => 0,
        };
        self.bytes.push((worker & 1) | ((step & 7) << 1) | side);
        self.bytes
            .extend_from_slice(&(packet.len() as u16).to_be_bytes());
        self.bytes.extend_from_slice(packet);
        self
    }

    pub fn action(mut self, action: Action, server: u16) -> Self {
        let index = ACTIONS.iter().position(|a| *a == action).unwrap() as u8;
        self.bytes.push(0x80 | ((server as u8 & 7) << 3) | index);
        self
    }

    pub fn msb(mut self, server: u16, msb: u16) -> Self {
        self.bytes.push(0xc0 | (server as u8 & 7));
        self.bytes.extend_from_slice(&msb.to_be_bytes());
        self
    }

    /// A load report: `kind` 1 load `value / 100`, 2 connections `value`, 3 both.
    pub fn load(mut self, server: u16, kind: u8, value: u16) -> Self {
        self.bytes
            .push(0xc0 | ((kind & 7) << 3) | (server as u8 & 7));
        self.bytes.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub fn build(self) -> Vec<u8> {
        self.bytes
    }
}

/// One parsed record of an input.
pub(super) enum Record<'a> {
    Packet {
        worker: usize,
        now: Nanos,
        ingress: Ingress,
        bytes: &'a [u8],
    },
    /// Index into the plan's snapshots (the control plane state after that action).
    Control(usize),
    /// An imported clock: the server's TSval is `v << 16` at `now` (the last packet's time).
    Msb(ServerId, u16, Nanos),
    /// A load report, as an agent or the operator sends it (`SharedLoads::report`).
    Load(ServerId, ReportedLoad),
}

/// Splits an input into records, applying the limits and computing every packet's `now`.
/// Returns the records and the control actions with the time they happen at.
pub(super) fn parse(records: &[u8]) -> (Vec<Record<'_>>, Vec<(Action, u16, Nanos)>) {
    let mut out = Vec::new();
    let mut actions = Vec::new();
    let mut now: Nanos = NANOS_PER_SEC;
    let mut rest = records;
    for _ in 0..MAX_RECORDS {
        let Some((&tag, tail)) = rest.split_first() else {
            break;
        };
        rest = tail;
        match tag {
            0x00..=0x7f => {
                now += STEPS[((tag >> 1) & 7) as usize];
                let len = match rest {
                    [hi, lo, ..] => u16::from_be_bytes([*hi, *lo]) as usize,
                    _ => rest.len(),
                };
                rest = &rest[rest.len().min(2)..];
                let (packet, tail) = rest.split_at(len.min(rest.len()));
                rest = tail;
                out.push(Record::Packet {
                    worker: (tag & 1) as usize,
                    now,
                    ingress: if tag & CLIENT_SIDE == CLIENT_SIDE {
                        Ingress::ClientSide
                    } else {
                        Ingress::ServerSide
                    },
                    bytes: &packet[..packet.len().min(MAX_PACKET)],
                });
            }
            0x80..=0xbf => {
                if actions.len() < MAX_CONTROL_ACTIONS {
                    out.push(Record::Control(actions.len()));
                    actions.push((ACTIONS[(tag & 7) as usize], u16::from((tag >> 3) & 7), now));
                }
            }
            0xc0..=0xff => {
                let Some((msb, tail)) = rest.split_first_chunk::<2>() else {
                    break;
                };
                rest = tail;
                let (id, value) = (ServerId(u16::from(tag & 7)), u16::from_be_bytes(*msb));
                let load = Some(f64::from(value) / 100.0);
                let connections = Some(u64::from(value));
                out.push(match (tag >> 3) & 7 {
                    1 => Record::Load(
                        id,
                        ReportedLoad {
                            load,
                            active_connections: None,
                        },
                    ),
                    2 => Record::Load(
                        id,
                        ReportedLoad {
                            load: None,
                            active_connections: connections,
                        },
                    ),
                    3 => Record::Load(
                        id,
                        ReportedLoad {
                            load,
                            active_connections: connections,
                        },
                    ),
                    _ => Record::Msb(id, value, now),
                });
            }
        }
    }
    (out, actions)
}
