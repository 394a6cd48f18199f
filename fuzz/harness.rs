//! The pipeline fuzz harness, shared by the `pipeline` cargo-fuzz target and by the stable
//! `cargo test` that replays the committed corpus (`crates/core/tests/fuzz_corpus.rs`).
//!
//! Both include this file with `#[path = ...] mod harness;` so that a corpus file checked
//! on stable is checked by exactly the logic and invariants the fuzzer ran it under; a copy
//! would drift. It only uses the public API of `cheetah-core`.
//!
//! # Input format
//!
//! ```text
//! byte 0   config:  bits 0-1 mode (0 cheetah, 1 hash, 2 maglev, 3 cheetah)
//!                   bit 2    forwarding (0 l2, 1 nat)
//!                   bits 3-5 policy of VIP 10.0.0.100:80 (index into PolicyKind::ALL)
//!                   bit 6    extra VIPs: 10.0.0.100:443 (backend port 8443) and an IPv6 VIP
//!                   bit 7    two workers sharing one LbShared (else one)
//! byte 1   servers: bits 0-1 servers 1..=n+1 in the config; bit 2 server 2 starts draining
//! then records until the input ends:
//!   tag 0x00..=0x7f  packet: bit 0 worker, bits 1-3 time step (STEPS), then a 2-byte
//!                    big-endian length and that many bytes (fewer if the input ends)
//!   tag 0x80..=0xbf  control action (ACTIONS[tag & 7]) on server id (tag >> 3) & 7
//!   tag 0xc0..=0xff  server id tag & 7, then a 2-byte big-endian value v; bits 3-5 say
//!                    what it is: 1 reported load v/100, 2 reported connections v, 3 both,
//!                    anything else a clock import (TSval v << 16 at the current time)
//! ```
//! Every packet is processed with a strictly increasing `now`, and every verdict is checked
//! against the invariants in [`check`]. A violation panics, which is what the fuzzer and
//! the corpus test look for.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use cheetah_core::config::{ConfiguredState, Forwarding, LbConfig, Mode, VipConfig};
use cheetah_core::cookie::CookieLayout;
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::lb::{Counter, LbShared, Worker, WorkerConfig};
use cheetah_core::policy::{LoadMetric, PolicyKind, PoolSnapshot, ReportedLoad};
use cheetah_core::tables::{
    AllServers, ControlPlane, ServerSlot, ServerSpec, SlotState, Snapshot, VipEntry,
};
use cheetah_core::testkit;
use cheetah_core::types::{Nanos, ServerId, NANOS_PER_MS, NANOS_PER_SEC};
use cheetah_core::verdict::Verdict;
use cheetah_core::wire::ethernet::ethertype;
use cheetah_core::wire::tcp_options::{self, SegmentKind, TSECR, TSVAL};
use cheetah_core::wire::{checksum, ip_proto, tcp, EthernetFrame, Ipv4Packet};

/// Fixed secret: the harness must be deterministic, and a secret does not change code paths.
pub const SECRET: Secret = Secret([
    0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0,
]);

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
            });
            config.vips.push(VipConfig {
                address: IpAddr::V6(IPV6_VIP),
                port: 80,
                policy: PolicyKind::RoundRobin,
                load_metric: None,
                backend_port: Some(9080),
                servers: (1..=self.servers).collect(),
                weights: Default::default(),
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

    /// A packet for `worker` (0 or 1) after time step `step` (index into [`STEPS`]).
    pub fn packet(mut self, worker: u8, step: u8, packet: &[u8]) -> Self {
        assert!(packet.len() <= u16::MAX as usize);
        self.bytes.push((worker & 1) | ((step & 7) << 1));
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
enum Record<'a> {
    Packet {
        worker: usize,
        now: Nanos,
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
fn parse(records: &[u8]) -> (Vec<Record<'_>>, Vec<(Action, u16, Nanos)>) {
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

/// Plans kept at most per process; past that the cache starts over (memory stays small
/// because plans share their pools through [`Cache::pools`]).
const MAX_SETUPS: usize = 4096;
const MAX_POOLS: usize = 4096;

/// A VIP as the control model keeps it.
#[derive(Clone, Debug)]
struct VipModel {
    address: IpAddr,
    port: u16,
    policy: PolicyKind,
    metric: LoadMetric,
    backend_port: u16,
    members: Vec<(ServerId, u32)>,
    /// Servers that left the pool but still serve their connections (NAT replies).
    departed: Vec<ServerId>,
}

/// A small model of the control plane's state, driven by the input's actions.
///
/// Why not a real [`ControlPlane`] per input: every snapshot it publishes builds a
/// 65537-slot Maglev table per VIP, about 10 ms under coverage instrumentation, which
/// held the fuzzer to ~60 executions per second. The model starts from the validated config
/// as `ControlPlane::new` does, and actions change it with the same rules as `ControlPlane` (drain, activate, remove with quarantine, add after
/// expiring, set_policy, leave/join the pool of 10.0.0.100:80, expire), and its snapshots
/// reuse cached pools (and so Maglev tables) keyed by their exact content. Side effects the
/// control plane has on `LbShared` (loads reset on add/remove, M forgotten on add/expire)
/// are applied the same way. [`model_matches_control_plane`] holds the model to a real
/// `ControlPlane`, and the corpus test runs it over many action sequences.
#[derive(Clone, Debug)]
struct Model {
    mode: Mode,
    forwarding: Forwarding,
    quarantine: Nanos,
    servers: BTreeMap<ServerId, (ServerSlot, Option<Nanos>)>,
    vips: Vec<VipModel>,
    /// Servers whose clock the last action made the LB forget (an id added or expired):
    /// the harness's [`Clocks`] forget them too.
    forgotten: Vec<ServerId>,
}

impl Model {
    /// The state a `ControlPlane` starts from for `config` (checked against a real one by
    /// [`model_matches_control_plane`]).
    fn from_config(config: &LbConfig) -> Self {
        let (servers, vips) = config.validate().expect("harness configs are valid");
        Model {
            mode: config.mode,
            forwarding: config.forwarding,
            quarantine: config.quarantine_secs * NANOS_PER_SEC,
            servers: servers
                .into_iter()
                .map(|s| {
                    let state = match s.state {
                        ConfiguredState::Active => SlotState::Active,
                        ConfiguredState::Draining => SlotState::Draining,
                    };
                    let slot = ServerSlot {
                        dip: s.dip,
                        mac: s.mac.unwrap_or_default(),
                        state,
                        has_mac: s.mac.is_some(),
                    };
                    (s.id, (slot, None))
                })
                .collect(),
            vips: vips
                .into_iter()
                .map(|v| VipModel {
                    address: v.address,
                    port: v.port,
                    policy: v.policy,
                    metric: v.metric,
                    backend_port: v.backend_port,
                    members: v.members,
                    departed: v.departed,
                })
                .collect(),
            forgotten: Vec::new(),
        }
    }

    fn snapshot(&self, generation: u64, pools: &mut PoolCache, hasher: &FlowHasher) -> Snapshot {
        let len = self
            .servers
            .keys()
            .next_back()
            .map_or(0, |id| id.index() + 1);
        let mut slots = vec![ServerSlot::default(); len];
        for (id, (slot, _)) in &self.servers {
            slots[id.index()] = *slot;
        }
        let vips = self
            .vips
            .iter()
            .map(|v| {
                let active: Vec<(ServerId, u32)> = v
                    .members
                    .iter()
                    .copied()
                    .filter(|(id, _)| {
                        self.servers
                            .get(id)
                            .is_some_and(|(s, _)| s.state == SlotState::Active)
                    })
                    .collect();
                VipEntry {
                    address: v.address,
                    port: v.port,
                    policy: v.policy,
                    pool: pools.get(&active, v.metric),
                    members: v.members.clone(),
                    departed: v.departed.clone(),
                    backend_port: v.backend_port,
                }
            })
            .collect();
        Snapshot::new(
            generation,
            self.mode,
            self.forwarding,
            AllServers::from_slots(slots),
            vips,
            hasher,
        )
    }

    fn state(&self, id: ServerId) -> Option<SlotState> {
        self.servers.get(&id).map(|(s, _)| s.state)
    }

    /// Applies `action`; returns whether anything changed (the control plane publishes a
    /// snapshot only then) and applies the side effects on `shared`.
    fn apply(&mut self, action: Action, server: u16, now: Nanos, shared: &LbShared) -> bool {
        let id = ServerId(server);
        match action {
            Action::Drain => match self.state(id) {
                Some(SlotState::Active) => {
                    self.servers.get_mut(&id).unwrap().0.state = SlotState::Draining;
                    true
                }
                _ => false,
            },
            Action::Activate => match self.state(id) {
                Some(SlotState::Active | SlotState::Draining) => {
                    self.servers.get_mut(&id).unwrap().0.state = SlotState::Active;
                    true
                }
                _ => false,
            },
            Action::Remove => match self.state(id) {
                Some(SlotState::Active | SlotState::Draining) => {
                    let entry = self.servers.get_mut(&id).unwrap();
                    entry.0.state = SlotState::Removed;
                    entry.1 = Some(now);
                    for vip in &mut self.vips {
                        vip.members.retain(|(m, _)| *m != id);
                        vip.departed.retain(|m| *m != id);
                    }
                    shared.loads.reset(id);
                    true
                }
                _ => false,
            },
            Action::Add => {
                let expired = self.expire(now, shared);
                if self.servers.contains_key(&id) {
                    return expired;
                }
                let slot = ServerSlot {
                    dip: testkit::server_dip(server),
                    mac: testkit::server_mac(server),
                    state: SlotState::Active,
                    has_mac: true,
                };
                self.servers.insert(id, (slot, None));
                self.vips[0].members.push((id, 1));
                shared.loads.reset(id);
                shared.msb.forget(id);
                self.forgotten.push(id);
                true
            }
            Action::SetPolicy => {
                let policy = PolicyKind::ALL[usize::from(server)];
                self.vips[0].policy = policy;
                self.vips[0].metric = policy.default_metric();
                true
            }
            Action::LeavePool => {
                let before = self.vips[0].members.len();
                self.vips[0].members.retain(|(m, _)| *m != id);
                let left = self.vips[0].members.len() != before;
                if left {
                    self.vips[0].departed.push(id);
                }
                left
            }
            Action::JoinPool => match self.state(id) {
                Some(SlotState::Active | SlotState::Draining)
                    if !self.vips[0].members.iter().any(|(m, _)| *m == id) =>
                {
                    self.vips[0].members.push((id, u32::from(server) + 1));
                    self.vips[0].departed.retain(|m| *m != id);
                    true
                }
                _ => false,
            },
            Action::Expire => self.expire(now, shared),
        }
    }

    fn expire(&mut self, now: Nanos, shared: &LbShared) -> bool {
        let quarantine = self.quarantine;
        let expired: Vec<ServerId> = self
            .servers
            .iter()
            .filter(|(_, (_, at))| at.is_some_and(|at| now.saturating_sub(at) >= quarantine))
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.servers.remove(id);
            shared.msb.forget(*id);
            self.forgotten.push(*id);
        }
        !expired.is_empty()
    }
}

/// A pool's exact content: active members with weights, and the load metric's index.
type PoolKey = (Vec<(ServerId, u32)>, u8);

/// Pools by exact content, so that equal pools share one Maglev table.
#[derive(Default)]
struct PoolCache {
    pools: HashMap<PoolKey, Arc<PoolSnapshot>>,
}

impl PoolCache {
    fn get(&mut self, members: &[(ServerId, u32)], metric: LoadMetric) -> Arc<PoolSnapshot> {
        let key = (members.to_vec(), metric_index(metric));
        if let Some(pool) = self.pools.get(&key) {
            return Arc::clone(pool);
        }
        if self.pools.len() >= MAX_POOLS {
            self.pools.clear();
        }
        let pool = Arc::new(PoolSnapshot::new(
            members.iter().map(|m| m.0).collect(),
            members.iter().map(|m| m.1).collect(),
            metric,
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        ));
        self.pools.insert(key, Arc::clone(&pool));
        pool
    }
}

fn metric_index(metric: LoadMetric) -> u8 {
    match metric {
        LoadMetric::ActiveConnections => 0,
        LoadMetric::Packets => 1,
        LoadMetric::Bytes => 2,
        LoadMetric::Reported => 3,
    }
}

/// Per-process state reused across inputs, because building it per input would cost far
/// more than running the input (see [`Model`]; `LbShared` also holds tables for all
/// 32768 ids).
///
/// Reuse must not make a run depend on earlier inputs, or crashes would not reproduce:
/// the cached models and pools are pure functions of their keys, and `run` resets every id
/// the input can reach in the shared MSB and load tables, clears the handshake and fallback
/// tables and the close filter, then publishes a fresh snapshot under a new generation
/// before creating fresh workers.
struct Cache {
    shared: Arc<LbShared>,
    generation: u64,
    setups: HashMap<[u8; 2], (LbConfig, Model)>,
    pools: PoolCache,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        // Small handshake and fallback tables and close filter, cleared per input in a few stores.
        shared: Arc::new(LbShared::with_table_sizes(&SECRET, CookieLayout::DEFAULT, Snapshot::empty(), 64, FALLBACK_CAPACITY)),
        generation: 0,
        setups: HashMap::new(),
        pools: PoolCache::default(),
    });
}

/// The shared fallback table's size in the harness: a few sets, so that inputs fill them
/// and evict, and clearing it per input costs little.
const FALLBACK_CAPACITY: usize = 64;

/// Server ids an input can reach: configured ones, added ones and imported MSBs use 0..=7.
const REACHABLE_IDS: u16 = 8;

/// Which invariants are enforced.
///
/// A known core bug can be tolerated here while it is open, so the fuzzer keeps looking
/// for other bugs instead of re-finding it; the inputs go to `fuzz/regressions/` and
/// `run_strict` keeps failing on them until the fix. None is tolerated now: the one this
/// was written for (the fallback table routing to removed servers) is fixed in core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    /// Accept a `ToServer` naming a removed or freed server when the worker's fallback
    /// counters show the fallback table routed the packet.
    pub tolerate_fallback_to_removed: bool,
}

impl Checks {
    /// What the fuzz target and the corpus test enforce: everything but open known bugs.
    pub const FUZZ: Checks = Checks {
        tolerate_fallback_to_removed: false,
    };
    pub const STRICT: Checks = Checks {
        tolerate_fallback_to_removed: false,
    };
}

/// Runs one fuzz input. Panics on any invariant violation (and on any panic in the core).
pub fn run(data: &[u8]) {
    run_with(data, Checks::FUZZ)
}

/// [`run`] with every invariant enforced, known open bugs included.
pub fn run_strict(data: &[u8]) {
    run_with(data, Checks::STRICT)
}

pub fn run_with(data: &[u8], checks: Checks) {
    let [config_byte, servers_byte, records @ ..] = data else {
        return;
    };
    let setup = Setup::decode(*config_byte, *servers_byte);
    let (records, actions) = parse(records);
    CACHE.with(|cache| {
        let cache = &mut *cache.borrow_mut();
        let key = [*config_byte, *servers_byte];
        if !cache.setups.contains_key(&key) {
            if cache.setups.len() >= MAX_SETUPS {
                cache.setups.clear();
            }
            let config = setup.config();
            let model = Model::from_config(&config);
            cache.setups.insert(key, (config, model));
        }
        let (config, model) = &cache.setups[&key];
        let (config, mut model) = (config.clone(), model.clone());
        let shared = Arc::clone(&cache.shared);
        for id in 0..REACHABLE_IDS {
            shared.msb.forget(ServerId(id));
            shared.loads.reset(ServerId(id));
        }
        shared.handshakes.clear();
        shared.fallback.clear();
        shared.closes.clear();
        cache.generation += 1;
        shared
            .snapshot
            .publish(model.snapshot(cache.generation, &mut cache.pools, &shared.hasher));
        let worker_count = if setup.two_workers { 2 } else { 1 };
        let mut clocks = Clocks::new(shared.layout());
        let mut refreshed: Nanos = 0;
        let mut workers: Vec<Worker> = (0..worker_count)
            .map(|i| {
                Worker::new(
                    Arc::clone(&shared),
                    WorkerConfig::new(i, worker_count, &config),
                )
            })
            .collect();
        for record in records {
            match record {
                Record::Packet { worker, now, bytes } => {
                    // As the daemon does every second: carry every M^ forward with LB time.
                    if now - refreshed >= NANOS_PER_SEC {
                        shared.msb.refresh(now);
                        clocks.refresh(now);
                        refreshed = now;
                    }
                    process_and_check(
                        &mut workers[worker % worker_count],
                        bytes,
                        now,
                        checks,
                        &mut clocks,
                    );
                }
                Record::Control(index) => {
                    let (action, server, now) = actions[index];
                    let changed = model.apply(action, server, now, &shared);
                    for id in model.forgotten.drain(..) {
                        clocks.forget(id);
                    }
                    if changed {
                        cache.generation += 1;
                        shared.snapshot.publish(model.snapshot(
                            cache.generation,
                            &mut cache.pools,
                            &shared.hasher,
                        ));
                    }
                }
                Record::Msb(id, msb, now) => {
                    let tsval = u32::from(msb) << 16;
                    shared.msb.import(&[(id, tsval)], now);
                    clocks.import(id, tsval, now);
                }
                Record::Load(id, report) => {
                    shared
                        .loads
                        .report(id, report)
                        .expect("finite, non-negative load");
                }
            }
        }
    });
}

/// Processes `packet` on `worker` and checks every invariant of the verdict; for
/// [`Verdict::ToAllServers`] also prepares and checks each copy, and for a cookie put into a
/// server's packet also echoes it back as the client would (see [`echo_cookie`]).
pub fn process_and_check(
    worker: &mut Worker,
    packet: &[u8],
    now: Nanos,
    checks: Checks,
    clocks: &mut Clocks,
) -> Verdict {
    let (verdict, output) = process_checked(worker, packet, now, checks, clocks);
    if verdict == Verdict::ToClient {
        echo_cookie(worker, packet, &output, now, checks, clocks);
    }
    verdict
}

/// Processes one packet and checks the invariants; returns the verdict and the output.
fn process_checked(
    worker: &mut Worker,
    packet: &[u8],
    now: Nanos,
    checks: Checks,
    clocks: &mut Clocks,
) -> (Verdict, Vec<u8>) {
    let fallback_routed = |worker: &Worker| {
        let counters = worker.counters();
        counters.get(Counter::FallbackHits) + counters.get(Counter::IcmpRoutedByFallback)
    };
    let fallback_before = fallback_routed(worker);
    let beyond_before = worker.shared().msb.echoes_beyond_idle_limit();
    let mut buffer = packet.to_vec();
    let verdict = worker.process(&mut buffer, now);
    let by_fallback = fallback_routed(worker) != fallback_before;
    let echo = Echo {
        clocks,
        now,
        counted_beyond: worker.shared().msb.echoes_beyond_idle_limit() - beyond_before,
    };
    let snapshot = Arc::clone(worker.snapshot());
    let tolerate_removed = checks.tolerate_fallback_to_removed && by_fallback;
    check(
        worker,
        &snapshot,
        packet,
        &buffer,
        verdict,
        tolerate_removed,
        Some(echo),
    );
    if let Verdict::ToAllServers { vip } = verdict {
        let targets = worker.copy_targets(vip).to_vec();
        assert!(
            !targets.is_empty(),
            "ToAllServers for a VIP without servers"
        );
        for server in targets {
            let mut copy = packet.to_vec();
            worker.prepare_copy(&mut copy, vip, server);
            check(
                worker,
                &snapshot,
                packet,
                &copy,
                Verdict::ToServer(server),
                false,
                None,
            );
        }
    }
    (verdict, buffer)
}

/// The round trip that is the point of the cookie: a client echoing, in TSecr, the TSval a
/// server's packet left the LB with must be routed to that server (whatever its clock:
/// the LB knows it, having just learnt from it), and [`check_cookie`] holds the restored
/// TSecr to the harness's [`Clocks`]: exactly the TSval sent whenever the model says that
/// MSB is in the layout's window.
fn echo_cookie(
    worker: &mut Worker,
    input: &[u8],
    output: &[u8],
    now: Nanos,
    checks: Checks,
    clocks: &mut Clocks,
) {
    let snapshot = Arc::clone(worker.snapshot());
    if snapshot.mode != Mode::Cheetah {
        return;
    }
    let Some(l) = ipv4_layout(output).filter(|l| l.protocol == ip_proto::TCP) else {
        return;
    };
    let Some((tsval_at, _, _)) = timestamp_at(output, l) else {
        return;
    };
    let (src, sport) = (read_u32(input, l.l3 + 12), read_u16(input, l.l4));
    let sender = if snapshot.forwarding == Forwarding::Nat {
        snapshot.nat_backend(src, sport)
    } else {
        let mac: [u8; 6] = input[6..12].try_into().unwrap();
        snapshot
            .server_by_mac(&mac)
            .zip(snapshot.vip_index(src, sport))
    };
    let Some((server, vip)) = sender else {
        return;
    };
    let vip = snapshot.vip(vip);
    let (original, cookie) = (read_u32(input, tsval_at), read_u32(output, tsval_at));
    let exact = clocks.certainly_restores(server, (original >> 16) as u16);
    let echo = testkit::TcpFrame {
        src_mac: testkit::CLIENT_MAC,
        dst_mac: testkit::LB_MAC,
        src_ip: read_u32(output, l.l3 + 16),
        dst_ip: vip.ipv4_or_zero(),
        src_port: read_u16(output, l.l4 + 2),
        dst_port: vip.port,
        seq: read_u32(output, l.l4 + 8),
        ack: read_u32(output, l.l4 + 4).wrapping_add(1),
        flags: tcp::flags::ACK,
        options: testkit::options::nop_nop_ts(0x0102_0304, cookie),
        payload: Vec::new(),
    }
    .build();
    let (verdict, restored) = process_checked(worker, &echo, now, checks, clocks);
    assert_eq!(
        verdict,
        Verdict::ToServer(server),
        "the client's echo of {server:?}'s cookie {cookie:#010x} must reach {server:?}"
    );
    if exact {
        let (_, tsecr_at) = testkit::timestamp_offsets(&restored).expect("echo has a timestamp");
        assert_eq!(
            read_u32(&restored, tsecr_at),
            original,
            "the echo's TSecr must be restored to the TSval {server:?} sent"
        );
    }
}

/// What [`check_cookie`] needs to hold a restored echo to the harness's model.
pub struct Echo<'a> {
    clocks: &'a mut Clocks,
    now: Nanos,
    /// How much the core's `echoes_beyond_idle_limit` moved while processing the packet.
    counted_beyond: u64,
}

/// A cookie's server id and epoch, from the layout's definition:
/// `| epoch : k | (id XOR (hash >> 32)) : 16 - k |` in the timestamp's 16 MSB.
fn decode(layout: CookieLayout, timestamp: u32, hash: u64) -> (ServerId, u16) {
    let id_bits = 16 - layout.epoch_bits();
    let id_mask = (1u32 << id_bits) - 1;
    let cookie = timestamp >> 16;
    let id = (cookie ^ (hash >> 32) as u32) & id_mask;
    (ServerId(id as u16), (cookie >> id_bits) as u16)
}

/// `a` is later than `b` in 16-bit serial arithmetic.
fn later(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) > 0
}

/// The harness's own account of each server's timestamp clock, from what the servers sent
/// through the LB and what the input imported, kept without asking the core's `MsbTable`.
///
/// The layout promises (docs/timestamps.md): an echo of epoch e is restored to the newest
/// MSB `<= M^ + 1` that is e mod 2^k, where M^ is the LB's estimate of the server's MSB now.
/// The model cannot know M^ exactly (the LB reads its clock in whole ms, and carries the
/// estimate forward up to 1/2048 slower than real time), so it keeps bounds `low..=high`
/// on it, from the same three events the LB learns from:
/// * a reply whose MSB is later than every MSB seen from that server moves M^ to at least
///   that MSB and becomes the anchor (the same MSB, one earlier, or a clock that went
///   further back teach nothing);
/// * a refresh at `now` carries M^ to the anchor's TSval plus the LB time since, less at
///   most 1/2048 of it;
/// * an import sets the clock (and M^) to the imported TSval.
///
/// Every window of M^ in `low..=high` holds the same MSB for an epoch when that MSB is in
/// all of them; for such an echo of an MSB the server actually sent, the restore must give
/// exactly that MSB. For any other echo (forged, or too old) it must still be in the window.
pub struct Clocks {
    epochs: u16,
    servers: [Option<Clock>; REACHABLE_IDS as usize],
}

struct Clock {
    /// Every MSB the server sent (or was imported), with the LB time it was seen at.
    sent: Vec<(u16, Nanos)>,
    /// The latest MSB seen: what a reply must be later than to teach the clock.
    seen: u16,
    /// The TSval that last moved `seen`, or was imported, and when.
    anchor: (u32, Nanos),
    low: u16,
    high: u16,
}

thread_local! {
    /// (exact, beyond) over the thread's runs, so the corpus test can show the model checked
    /// something.
    static ECHO_STATS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Over this thread's runs: (echoes held to an MSB their server sent, echoes found beyond
/// the idle limit and counted by the core).
pub fn echo_stats() -> (u64, u64) {
    ECHO_STATS.with(|s| s.get())
}

impl Clocks {
    pub fn new(layout: CookieLayout) -> Self {
        Clocks {
            epochs: 1 << layout.epoch_bits(),
            servers: Default::default(),
        }
    }

    fn clock(&mut self, server: ServerId) -> Option<&mut Clock> {
        self.servers.get_mut(server.index())?.as_mut()
    }

    pub fn forget(&mut self, server: ServerId) {
        if let Some(slot) = self.servers.get_mut(server.index()) {
            *slot = None;
        }
    }

    pub fn import(&mut self, server: ServerId, tsval: u32, now: Nanos) {
        let msb = (tsval >> 16) as u16;
        if let Some(slot) = self.servers.get_mut(server.index()) {
            let mut sent = slot.take().map(|c| c.sent).unwrap_or_default();
            sent.push((msb, now));
            *slot = Some(Clock {
                sent,
                seen: msb,
                anchor: (tsval, now),
                low: msb,
                high: msb,
            });
        }
    }

    /// `server` sent `tsval` through the LB at `now`.
    pub fn sent(&mut self, server: ServerId, tsval: u32, now: Nanos) {
        let msb = (tsval >> 16) as u16;
        let Some(clock) = self.clock(server) else {
            return self.import(server, tsval, now);
        };
        clock.sent.push((msb, now));
        if later(msb, clock.seen) {
            clock.seen = msb;
            clock.anchor = (tsval, now);
            if later(msb, clock.low) {
                clock.low = msb;
            }
            if later(msb, clock.high) {
                clock.high = msb;
            }
        }
    }

    pub fn refresh(&mut self, now: Nanos) {
        for clock in self.servers.iter_mut().flatten() {
            let (tsval, at) = clock.anchor;
            // The LB reads whole ms, so it may see up to 1 ms more than elapsed.
            let elapsed = (now - at) / NANOS_PER_MS;
            let slowest = tsval.wrapping_add((elapsed - elapsed.div_ceil(2048)) as u32);
            let fastest = tsval.wrapping_add((elapsed + 1) as u32);
            let (slowest, fastest) = ((slowest >> 16) as u16, (fastest >> 16) as u16);
            if later(slowest, clock.low) {
                clock.low = slowest;
            }
            if later(fastest, clock.high) {
                clock.high = fastest;
            }
        }
    }

    /// Whether an echo of `msb` is restored to `msb` whatever M^ is within the bounds.
    pub fn certainly_restores(&self, server: ServerId, msb: u16) -> bool {
        let Some(Some(clock)) = self.servers.get(server.index()) else {
            return false;
        };
        let span = clock.high.wrapping_sub(clock.low);
        let back = clock.low.wrapping_add(1).wrapping_sub(msb);
        span < self.epochs && back < self.epochs - span
    }

    /// The rule: the newest MSB `<= m + 1` that is `epoch` mod 2^k.
    fn rule(&self, m: u16, epoch: u16) -> u16 {
        let newest = m.wrapping_add(1);
        newest.wrapping_sub(newest.wrapping_sub(epoch) % self.epochs)
    }

    /// A client's echo of `epoch` routed by cookie to `server` left with MSB `restored`;
    /// the core counted `counted_beyond` echoes beyond the idle limit meanwhile.
    fn check_restore(&mut self, server: ServerId, epoch: u16, restored: u16, counted_beyond: u64) {
        let epochs = self.epochs;
        let Some(Some(clock)) = self.servers.get(server.index()) else {
            panic!("echo routed by cookie to {server:?}, whose clock the LB never learnt");
        };
        let (low, high) = (clock.low, clock.high);
        assert_eq!(
            restored % epochs,
            epoch,
            "the restored MSB {restored:#06x} has the echo's epoch"
        );
        let (oldest, newest) = (self.rule(low, epoch), self.rule(high, epoch));
        assert!(
            restored.wrapping_sub(oldest) <= newest.wrapping_sub(oldest),
            "{server:?}: echo of epoch {epoch} restored to {restored:#06x}, outside the window: \
             M^ is {low:#06x}..={high:#06x}, so {oldest:#06x}..={newest:#06x}"
        );
        let sent = clock
            .sent
            .iter()
            .map(|&(msb, _)| msb)
            .filter(|&msb| msb % epochs == epoch)
            .find(|&msb| self.certainly_restores(server, msb));
        if let Some(msb) = sent {
            assert_eq!(
                restored, msb,
                "{server:?} sent MSB {msb:#06x} (epoch {epoch}) within the window of M^ in \
                 {low:#06x}..={high:#06x}: its echo must come back as that MSB"
            );
            ECHO_STATS.with(|s| s.set((s.get().0 + 1, s.get().1)));
        }
        // Past the idle limit: more than 2^(k-1) periods behind M^, for every M^ possible.
        let age = |m: u16| m.wrapping_sub(restored) as i16;
        let (young, old) = (age(low), age(high));
        let limit = (epochs / 2) as i16;
        if young > limit {
            assert_eq!(counted_beyond, 1, "{server:?}: an echo {young}..={old} periods behind M^ is counted beyond the idle limit");
            ECHO_STATS.with(|s| s.set((s.get().0, s.get().1 + 1)));
        } else if old <= limit {
            assert_eq!(
                counted_beyond, 0,
                "{server:?}: an echo {young}..={old} periods behind M^ is within the idle limit"
            );
        }
    }
}

/// Where the IPv4 header and its payload sit in a frame (mirrors the pipeline's parse).
#[derive(Clone, Copy, Debug)]
struct Layout {
    l3: usize,
    l4: usize,
    end: usize,
    protocol: u8,
}

fn ipv4_layout(frame: &[u8]) -> Option<Layout> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != ethertype::IPV4 {
        return None;
    }
    let l3 = eth.payload_offset();
    let ip = Ipv4Packet::new_checked(&frame[l3..]).ok()?;
    Some(Layout {
        l3,
        l4: l3 + ip.header_len(),
        end: l3 + ip.total_len(),
        protocol: ip.protocol(),
    })
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Folded ones'-complement sum of an IPv4 header. A header checksum is valid iff this is
/// 0xffff; an incremental update keeps it exactly equal (a bad checksum stays as bad).
fn ipv4_header_sum(frame: &[u8], l: Layout) -> u16 {
    checksum::fold(checksum::sum(&frame[l.l3..l.l4]))
}

/// Folded ones'-complement sum of a TCP segment with its pseudo header: 0xffff iff the
/// checksum is valid, and preserved exactly by every correct rewrite.
fn tcp_sum(frame: &[u8], l: Layout) -> u16 {
    let src = read_u32(frame, l.l3 + 12);
    let dst = read_u32(frame, l.l3 + 16);
    checksum::fold(
        tcp::pseudo_header_sum(src, dst, ip_proto::TCP, l.end - l.l4)
            + checksum::sum(&frame[l.l4..l.end]),
    )
}

/// Sums over the parts of an ICMP error that the pipeline may rewrite.
#[derive(Debug, PartialEq, Eq)]
struct IcmpSums {
    icmp: u16,
    quoted_ip: Option<u16>,
    /// Partial sum of the quoted TCP bytes with the quoted pseudo header: the bytes the
    /// router did not quote are constant, so a correct update keeps the partial sum too.
    quoted_tcp: Option<u16>,
}

fn icmp_sums(frame: &[u8], l: Layout) -> IcmpSums {
    let icmp = checksum::fold(checksum::sum(&frame[l.l4..l.end]));
    let ip = l.l4 + 8;
    let quoted = &frame[ip.min(l.end)..l.end];
    let mut sums = IcmpSums {
        icmp,
        quoted_ip: None,
        quoted_tcp: None,
    };
    if quoted.len() >= 20 && quoted[0] >> 4 == 4 {
        let ihl = usize::from(quoted[0] & 0x0f) * 4;
        if ihl >= 20 && quoted.len() >= ihl {
            sums.quoted_ip = Some(checksum::fold(checksum::sum(&quoted[..ihl])));
            let tcp = &quoted[ihl..];
            if quoted[9] == ip_proto::TCP && tcp.len() >= 18 {
                let len = usize::from(read_u16(quoted, 2)).saturating_sub(ihl);
                sums.quoted_tcp = Some(checksum::fold(
                    tcp::pseudo_header_sum(
                        read_u32(quoted, 12),
                        read_u32(quoted, 16),
                        ip_proto::TCP,
                        len,
                    ) + checksum::sum(tcp),
                ));
            }
        }
    }
    sums
}

/// The timestamp option of a TCP segment as the pipeline finds it, as absolute offsets of
/// (TSval, TSecr), or `None` (no option, or malformed options).
fn timestamp_at(frame: &[u8], l: Layout) -> Option<(usize, usize, SegmentKind)> {
    let segment = &frame[l.l4..l.end];
    if segment.len() < 20 {
        return None;
    }
    let header_len = usize::from(segment[12] >> 4) * 4;
    if header_len < 20 || header_len > segment.len() {
        return None;
    }
    let kind = SegmentKind::from_flags(segment[13]);
    let at = tcp_options::find_timestamp(&segment[20..header_len], kind)
        .ok()?
        .offset?;
    let base = l.l4 + 20 + at;
    Some((base + TSVAL, base + TSECR, kind))
}

fn flow_hash(worker: &Worker, client_ip: u32, client_port: u16, vip_ip: u32, vip_port: u16) -> u64 {
    worker.shared().hasher.hash(&FlowKey {
        client_ip,
        vip_ip,
        client_port,
        vip_port,
        protocol: ip_proto::TCP,
    })
}

/// The invariants every verdict must satisfy, whatever the input bytes.
fn check(
    worker: &Worker,
    snapshot: &Snapshot,
    input: &[u8],
    output: &[u8],
    verdict: Verdict,
    tolerate_removed: bool,
    echo: Option<Echo>,
) {
    assert_eq!(
        input.len(),
        output.len(),
        "the pipeline rewrites in place and never changes the length"
    );
    match verdict {
        // A dropped packet is not sent anywhere, but a passed one goes to the host kernel
        // and a copied one is copied from this buffer: none may have been touched.
        Verdict::Drop(_) | Verdict::Pass | Verdict::ToAllServers { .. } => {
            assert!(
                input == output,
                "{verdict:?} must leave the packet untouched\n in: {input:02x?}\nout: {output:02x?}"
            );
            if let Verdict::ToAllServers { vip } = verdict {
                assert!(usize::from(vip) < snapshot.vips.len(), "{verdict:?}");
            }
            return;
        }
        Verdict::ToServer(server) => {
            let slot = snapshot.servers.get(server);
            assert!(
                matches!(slot.state, SlotState::Active | SlotState::Draining) || tolerate_removed,
                "{verdict:?} names a server that is {:?} in snapshot generation {}",
                slot.state,
                snapshot.generation
            );
            if slot.has_mac {
                assert_eq!(output[0..6], slot.mac, "destination MAC of {verdict:?}");
            }
        }
        Verdict::ToClient => {}
    }
    // Forwarded: only IPv4 is ever forwarded, so both ends must parse the same way.
    let l = ipv4_layout(input).expect("only IPv4 packets are forwarded");
    let lo = ipv4_layout(output).expect("a forwarded packet still parses");
    assert_eq!(
        (l.l3, l.l4, l.end, l.protocol),
        (lo.l3, lo.l4, lo.end, lo.protocol)
    );
    assert_eq!(
        input[6..l.l3],
        output[6..l.l3],
        "source MAC, tags and EtherType are never rewritten"
    );
    assert_eq!(
        input[l.end..],
        output[l.end..],
        "bytes past the IPv4 total length are never rewritten"
    );
    assert_eq!(
        ipv4_header_sum(input, l),
        ipv4_header_sum(output, l),
        "{verdict:?}: the IPv4 header checksum must stay exactly as right or wrong as it was"
    );
    let nat = snapshot.forwarding == Forwarding::Nat;
    let (src_in, dst_in) = (read_u32(input, l.l3 + 12), read_u32(input, l.l3 + 16));
    let (src_out, dst_out) = (read_u32(output, l.l3 + 12), read_u32(output, l.l3 + 16));
    match verdict {
        Verdict::ToServer(server) => {
            assert_eq!(src_in, src_out, "the client address is never rewritten");
            let expected = if nat {
                snapshot.servers.get(server).dip
            } else {
                dst_in
            };
            assert_eq!(dst_out, expected, "destination address of {verdict:?}");
        }
        Verdict::ToClient => {
            assert_eq!(dst_in, dst_out, "the client address is never rewritten");
            assert_eq!(input[0..6], output[0..6], "ToClient keeps the MAC header");
        }
        _ => unreachable!(),
    }
    match l.protocol {
        ip_proto::TCP if l.end - l.l4 >= 20 => {
            assert_eq!(
                tcp_sum(input, l),
                tcp_sum(output, lo),
                "{verdict:?}: the TCP checksum must stay exactly as right or wrong as it was"
            );
            check_ports(snapshot, input, output, l, verdict);
            check_cookie(worker, snapshot, input, output, l, verdict, echo);
        }
        ip_proto::ICMP if l.end - l.l4 >= 8 => {
            assert_eq!(
                icmp_sums(input, l),
                icmp_sums(output, l),
                "{verdict:?}: ICMP, quoted IPv4 and quoted TCP checksums must stay exactly as right or wrong as they were"
            );
        }
        _ => assert!(
            input[l.l3..] == output[l.l3..],
            "{verdict:?}: a non-TCP, non-ICMP packet is forwarded unchanged past L2"
        ),
    }
}

/// Where a forwarded TCP packet goes: a new connection only to a server of the VIP's pool
/// (active, not draining), and in NAT mode the VIP port <-> backend port translation.
fn check_ports(snapshot: &Snapshot, input: &[u8], output: &[u8], l: Layout, verdict: Verdict) {
    let nat = snapshot.forwarding == Forwarding::Nat;
    let (src, dst) = (read_u32(input, l.l3 + 12), read_u32(input, l.l3 + 16));
    let (sport, dport) = (read_u16(input, l.l4), read_u16(input, l.l4 + 2));
    let (sport_out, dport_out) = (read_u16(output, l.l4), read_u16(output, l.l4 + 2));
    match verdict {
        Verdict::ToServer(server) => {
            let vip = snapshot
                .vip_index(dst, dport)
                .map(|v| snapshot.vip(v))
                .expect("a client packet forwarded to a server was for a VIP");
            assert_eq!(sport_out, sport, "the client port is never rewritten");
            let expected = if nat { vip.backend_port } else { dport };
            assert_eq!(dport_out, expected, "destination port of {verdict:?}");
            if SegmentKind::from_flags(input[l.l4 + 13]) == SegmentKind::Syn {
                assert!(
                    vip.pool.servers.contains(&server),
                    "a new connection went to {server:?}, outside the pool {:?}",
                    vip.pool.servers
                );
            }
        }
        Verdict::ToClient if nat => {
            let (_, vip) = snapshot
                .nat_backend(src, sport)
                .expect("a NAT reply came from a backend");
            let vip = snapshot.vip(vip);
            assert_eq!(
                read_u32(output, l.l3 + 12),
                vip.ipv4_or_zero(),
                "NAT replies leave from the VIP"
            );
            assert_eq!(sport_out, vip.port, "NAT replies leave from the VIP port");
            assert_eq!(dport_out, dport, "the client port is never rewritten");
        }
        _ => assert_eq!(
            (sport_out, dport_out),
            (sport, dport),
            "{verdict:?}: ports are only rewritten by NAT"
        ),
    }
}

/// Cheetah mode: what the cookie in a forwarded TCP packet says must agree with the verdict.
fn check_cookie(
    worker: &Worker,
    snapshot: &Snapshot,
    input: &[u8],
    output: &[u8],
    l: Layout,
    verdict: Verdict,
    echo: Option<Echo>,
) {
    if snapshot.mode != Mode::Cheetah {
        return;
    }
    let Some((tsval_at, tsecr_at, kind)) = timestamp_at(input, l) else {
        return;
    };
    let (src, dst) = (read_u32(input, l.l3 + 12), read_u32(input, l.l3 + 16));
    let (sport, dport) = (read_u16(input, l.l4), read_u16(input, l.l4 + 2));
    match verdict {
        Verdict::ToServer(server) => {
            assert_eq!(
                input[tsval_at..tsval_at + 4],
                output[tsval_at..tsval_at + 4],
                "the client's TSval is never rewritten"
            );
            if kind == SegmentKind::Syn {
                return;
            }
            if input[l.l4 + 13] & tcp::flags::ACK == 0 {
                // Without ACK, TSecr echoes nothing (RFC 7323): routed like a segment
                // without timestamps, and TSecr left as it is.
                assert_eq!(
                    input[tsecr_at..tsecr_at + 4],
                    output[tsecr_at..tsecr_at + 4],
                    "the TSecr of a client segment without ACK is never rewritten"
                );
                return;
            }
            // Routed by the cookie echoed in TSecr: it must decode to the chosen server,
            // and only the 16 MSB of TSecr may change, to what the harness's model of the
            // server's clock says (not what the core's own table says).
            let hash = flow_hash(worker, src, sport, dst, dport);
            let tsecr = read_u32(input, tsecr_at);
            let (id, epoch) = decode(worker.shared().layout(), tsecr, hash);
            assert_eq!(id, server, "cookie-routed {verdict:?}");
            let restored = read_u32(output, tsecr_at);
            assert_eq!(restored & 0xffff, tsecr & 0xffff, "TSecr low bits");
            if let Some(echo) = echo {
                echo.clocks.check_restore(
                    server,
                    epoch,
                    (restored >> 16) as u16,
                    echo.counted_beyond,
                );
            }
        }
        Verdict::ToClient => {
            // From a server: TSval now carries a cookie naming that server.
            let sender = if snapshot.forwarding == Forwarding::Nat {
                snapshot.nat_backend(src, sport)
            } else {
                let mac: [u8; 6] = input[6..12].try_into().unwrap();
                snapshot
                    .server_by_mac(&mac)
                    .zip(snapshot.vip_index(src, sport))
            };
            let Some((server, vip)) = sender else {
                panic!("ToClient for a TCP packet from no known server");
            };
            let vip = snapshot.vip(vip);
            let hash = flow_hash(worker, dst, dport, vip.ipv4_or_zero(), vip.port);
            let tsval = read_u32(input, tsval_at);
            let cookie_tsval = read_u32(output, tsval_at);
            assert_eq!(cookie_tsval & 0xffff, tsval & 0xffff, "TSval low bits");
            let layout = worker.shared().layout();
            let (id, epoch) = decode(layout, cookie_tsval, hash);
            assert_eq!(id, server, "the cookie names the sending server");
            assert_eq!(
                u32::from(epoch),
                (tsval >> 16) & u32::from(layout.epochs() - 1),
                "the cookie's epoch is the displaced MSB modulo 2^k"
            );
            if let Some(echo) = echo {
                echo.clocks.sent(server, tsval, echo.now);
            }
            assert_eq!(
                input[tsecr_at..tsecr_at + 4],
                output[tsecr_at..tsecr_at + 4],
                "the server's TSecr is never rewritten"
            );
        }
        _ => {}
    }
}

/// Applies the same actions to a real [`ControlPlane`] and to the harness [`Model`], and
/// panics if any published state differs (server slots, VIP policies, members, pools, and
/// the M and load resets). Keeps the fuzzer's fast model honest.
pub fn model_matches_control_plane(setup: Setup, actions: &[(Action, u16, Nanos)]) {
    let config = setup.config();
    let mut plane = ControlPlane::new(&config, &SECRET).expect("harness configs are valid");
    let mut model = Model::from_config(&config);
    let model_shared = LbShared::new(&SECRET, CookieLayout::DEFAULT, Snapshot::empty(), 8);
    let mut pools = PoolCache::default();
    let compare = |plane: &ControlPlane, model: &Model, pools: &mut PoolCache, step: &str| {
        let real = plane.shared().snapshot.load();
        let mine = model.snapshot(real.generation, pools, &model_shared.hasher);
        let slots = |s: &Snapshot| {
            s.servers
                .iter()
                .map(|(id, slot)| (id, *slot))
                .collect::<Vec<_>>()
        };
        assert_eq!(slots(&real), slots(&mine), "{setup:?} servers after {step}");
        assert_eq!(real.vips.len(), mine.vips.len());
        for (a, b) in real.vips.iter().zip(&mine.vips) {
            assert_eq!(
                (
                    a.address,
                    a.port,
                    a.policy,
                    a.backend_port,
                    &a.members,
                    &a.departed
                ),
                (
                    b.address,
                    b.port,
                    b.policy,
                    b.backend_port,
                    &b.members,
                    &b.departed
                ),
                "{setup:?} VIP after {step}"
            );
            assert_eq!(
                (&a.pool.servers, &a.pool.weights, a.pool.metric),
                (&b.pool.servers, &b.pool.weights, b.pool.metric),
                "{setup:?} pool after {step}"
            );
        }
        for id in 0..REACHABLE_IDS {
            let id = ServerId(id);
            assert_eq!(
                plane.shared().msb.get(id),
                model_shared.msb.get(id),
                "{setup:?} M of {id} after {step}"
            );
            assert_eq!(
                plane.shared().loads.server(id),
                model_shared.loads.server(id),
                "{setup:?} loads of {id} after {step}"
            );
        }
    };
    compare(&plane, &model, &mut pools, "start");
    for (i, &(action, server, now)) in actions.iter().enumerate() {
        // Give every reachable id an M and a load, so that forgetting and resets show.
        for id in 0..REACHABLE_IDS {
            let id = ServerId(id);
            let m = [(id, u32::from(7 + id.0) << 16)];
            plane.shared().msb.import(&m, now);
            model_shared.msb.import(&m, now);
            let report = cheetah_core::policy::ReportedLoad {
                load: Some(f64::from(id.0)),
                active_connections: Some(u64::from(id.0)),
            };
            plane.shared().loads.report(id, report).unwrap();
            model_shared.loads.report(id, report).unwrap();
        }
        let vip = format!("{}:{}", Ipv4Addr::from(testkit::VIP), testkit::VIP_PORT);
        let _ = match action {
            Action::Drain => plane.drain_server(server),
            Action::Activate => plane.activate_server(server),
            Action::Remove => plane.remove_server(server, now),
            Action::Add => plane
                .add_server(
                    ServerSpec {
                        id: Some(server),
                        dip: IpAddr::V4(Ipv4Addr::from(testkit::server_dip(server))),
                        mac: Some(cheetah_core::types::format_mac(&testkit::server_mac(
                            server,
                        ))),
                        vips: vec![(vip, 1)],
                    },
                    now,
                )
                .map(|_| ()),
            Action::SetPolicy => plane.set_policy(&vip, PolicyKind::ALL[usize::from(server)], None),
            Action::LeavePool => plane.leave_pool(&vip, server),
            Action::JoinPool => plane.join_pool(&vip, server, u32::from(server) + 1),
            Action::Expire => {
                plane.expire(now);
                Ok(())
            }
        };
        model.apply(action, server, now, &model_shared);
        compare(
            &plane,
            &model,
            &mut pools,
            &format!("action {i} {action:?}({server}) at {now}"),
        );
    }
}
