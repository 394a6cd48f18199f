//! Publishes the core's tables into the XDP program's maps, so its in-kernel path
//! (`bpf/lib/fast_path.h`) forwards exactly as the core would, and its steering knows the
//! LB's packets: `lb_config`, `vip_addrs`, `vips`, `vips_by_index`, `vip_big_pools`,
//! `vip_weights`, `vip_slots`, `servers`, `server_macs`, `backends`, `reply_senders`,
//! `server_side` and `maglev_tables` (`maglev_tables.rs`); and, on every new snapshot, the
//! per-CPU policy state the kernel's SYN path starts from (`xdp_policy.rs`).
//!
//! [`wanted`] works out every map's entries from a snapshot, the LB's interfaces and their
//! sides, and the kernel's routes and neighbours (a server's egress is resolved by the same
//! rule the AF_XDP workers use, `egress.rs`); [`Publisher::publish`] writes what changed
//! since its last call and deletes stale entries. The daemon publishes on every new
//! snapshot generation and once a second (routes and neighbours change on their own).
//! Every map holds two copies of the tables (`publish_window.rs`): a publication writes
//! the copy packets do not read, flips, and writes the same into the other.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::Context;
use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::cookie::CookieLayout;
use cheetah_core::lb::Ingress;
use cheetah_core::policy::schedule::{cycle_len_within, Schedule};
use cheetah_core::policy::{LoadMetric, PolicyKind};
use cheetah_core::tables::{vip_addr_bit, SlotState, Snapshot};
use libbpf_rs::{MapCore, MapFlags};

use super::egress;
use super::maglev_tables::{self, MaglevTables};
use super::publish_window::PublishWindow;
use super::reply_senders;
use super::vip_slots;
use super::xdp::SteeringProgram;
use super::xdp_layout::*;
use super::xdp_policy::{PolicySeeder, PolicySeeds};
use super::Interface;

/// What the XDP program is told about the LB at one moment.
pub struct Publication<'a> {
    pub snapshot: &'a Snapshot,
    pub layout: CookieLayout,
    /// The LB's interfaces (`[daemon] interfaces`), and beside each its side (`sides.rs`).
    pub interfaces: &'a [Interface],
    pub sides: &'a [Ingress],
    /// `[daemon] datapath = "xdp"`: the program forwards what it can itself.
    pub fast_path: bool,
    /// Sets of the shared fallback table (`FallbackTable::sets`; the `fallback` map's).
    pub fallback_sets: usize,
}

type Entries = BTreeMap<Vec<u8>, Vec<u8>>;

/// Every entry of every map the publisher owns, as key and value bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub config: LbConfigValue,
    pub vip_addrs: Entries,
    pub vips: Entries,
    pub vips_by_index: Entries,
    pub vip_slots: Entries,
    pub vip_weights: Entries,
    /// The pools over MAX_HASH_POOL servers (`vip_big_pools`), by VIP index.
    pub vip_big_pools: Entries,
    /// The cycles of the wrr VIPs the kernel reads one for (`kernel_wrr_cycle_len`).
    pub wrr_schedules: Entries,
    /// Their entries beyond `SCHEDULE_CAP`, by (VIP, chunk).
    pub wrr_schedule_chunks: Entries,
    pub servers: Entries,
    pub server_macs: Entries,
    pub backends: Entries,
    pub reply_senders: Entries,
    pub server_side: Entries,
    /// The `maglev_tables` slots (`maglev_tables.rs`).
    pub maglev: MaglevTables,
}

/// A `backend_info.vip_index` that names no VIP (`BACKEND_NO_VIP`; `vips_by_index` has
/// `MAX_VIPS` entries): an allocated server's (DIP, port) that no VIP claims (a removed
/// server's, whose late replies the kernel drops as the core does, or one outside every
/// pool with that backend port, whose replies go up).
pub const NO_VIP: u16 = u16::MAX;

fn array_key(index: usize) -> Vec<u8> {
    (index as u32).to_ne_bytes().to_vec()
}

/// Whether the kernel holds a pool of `pool_len` servers (`pool.h`): in `vip_info` up to
/// MAX_HASH_POOL, in `vip_big_pools` up to MAX_BIG_POOL.
pub fn kernel_holds_pool(pool_len: usize) -> bool {
    (1..=MAX_BIG_POOL).contains(&pool_len)
}

/// The policy the kernel places a VIP's SYNs by (`vip_info.policy`), given its pool's
/// weights (one per server): every policy, run as the core does, for a pool it holds (1 to
/// MAX_BIG_POOL servers), pow2 and least loaded over each CPU's load view
/// (`kernel_loads.rs`); maglev for a pool of any size, from the VIP's Maglev table
/// (`maglev_tables`, published for every non-empty pool outside hash mode), never from the
/// pool. wrr and awrr keep per-position state for MAX_HASH_POOL positions: over that,
/// the kernel reads their cycle instead of scanning credits. A wrr pool's must be one the
/// kernel reads ([`kernel_wrr_cycle_len`]); an awrr pool's always is (`awrr_buckets_into`
/// scales the buckets of a pool over 819 servers to fit). NONE leaves them to userspace
/// (a bigger pool); EMPTY (no server) has the kernel drop every new connection, as the
/// core does. Costs a pass over the weights (and for a wrr cycle over `SCHEDULE_CAP` a
/// sort of them, to count the distinct ones), not a cycle's build.
pub fn kernel_policy(kind: PolicyKind, weights: &[u32]) -> u8 {
    let pool_len = weights.len();
    if pool_len == 0 {
        return KERNEL_POLICY_EMPTY;
    }
    let within_state = pool_len <= MAX_HASH_POOL
        || match kind {
            PolicyKind::WeightedRoundRobin => kernel_wrr_cycle_len(weights).is_some(),
            _ => true,
        };
    if (kind != PolicyKind::Maglev && !kernel_holds_pool(pool_len)) || !within_state {
        return KERNEL_POLICY_NONE;
    }
    match kind {
        PolicyKind::RoundRobin => KERNEL_POLICY_RR,
        PolicyKind::WeightedRoundRobin => KERNEL_POLICY_WRR,
        PolicyKind::Random => KERNEL_POLICY_RANDOM,
        PolicyKind::Hash => KERNEL_POLICY_HASH,
        PolicyKind::PowerOfTwo => KERNEL_POLICY_POW2,
        PolicyKind::LeastLoaded => KERNEL_POLICY_LEAST_LOADED,
        // Its cycle (awrr_schedules) always fits: awrr_buckets_into scales its buckets.
        PolicyKind::AutoWeightedRoundRobin => KERNEL_POLICY_AWRR,
        PolicyKind::Maglev => KERNEL_POLICY_MAGLEV,
    }
}

/// Most steps the publisher spends writing out a wrr cycle longer than `SCHEDULE_CAP`:
/// its length times its distinct weights, about 1 ns each in a release build (about
/// 35 ms), once per change of a VIP's weights.
pub const MAX_CYCLE_STEPS: u64 = 1 << 25;

/// The length of the cycle the kernel reads for a wrr pool of `weights`, if it reads one:
/// up to `SCHEDULE_CAP` entries in `wrr_schedules`, or for a pool over MAX_HASH_POOL
/// servers (whose credits it cannot scan) up to `SCHEDULE_MAX_LEN` in chunks, if writing it
/// out costs at most [`MAX_CYCLE_STEPS`].
pub fn kernel_wrr_cycle_len(weights: &[u32]) -> Option<usize> {
    let cap = if weights.len() > MAX_HASH_POOL {
        SCHEDULE_MAX_LEN
    } else {
        SCHEDULE_CAP
    };
    let len = cycle_len_within(weights, cap)?;
    if len <= SCHEDULE_CAP {
        return Some(len);
    }
    // As the cycle's writer takes them: a weight of 0 counts as 1.
    let mut distinct: Vec<u32> = weights.iter().map(|&w| w.max(1)).collect();
    distinct.sort_unstable();
    distinct.dedup();
    (len as u64 * distinct.len() as u64 <= MAX_CYCLE_STEPS).then_some(len)
}

/// `vip_info.load_metric` for `metric`.
pub fn kernel_load_metric(metric: LoadMetric) -> u8 {
    match metric {
        LoadMetric::ActiveConnections => LOAD_METRIC_ACTIVE,
        LoadMetric::Reported => LOAD_METRIC_REPORTED,
        LoadMetric::Packets => LOAD_METRIC_PACKETS,
        LoadMetric::Bytes => LOAD_METRIC_BYTES,
    }
}

/// A wrr cycle as the kernel reads it: its `wrr_schedules` value and, beyond
/// `SCHEDULE_CAP` entries, its `wrr_schedule_chunks` values by chunk.
#[derive(Clone)]
struct CycleValues {
    head: Vec<u8>,
    chunks: Vec<(u8, Vec<u8>)>,
}

/// The values of the wrr cycles of the last publication, by the weights they were written
/// out from. The publisher runs every second and on every change of the tables; a cycle
/// costs up to its length times the distinct weights to write out, and only a change of
/// its VIP's weights changes it, so each is written out once per set of weights.
#[derive(Default)]
pub struct WrrCycles {
    by_weights: HashMap<Vec<u32>, Option<CycleValues>>,
    written_out: u64,
}

impl WrrCycles {
    /// The cycle the kernel reads for a pool of `weights` (None: it reads none,
    /// [`kernel_wrr_cycle_len`]), from `earlier` (the last publication's cycles) or
    /// written out now; kept in `self`.
    fn value_of(
        &mut self,
        earlier: &mut HashMap<Vec<u32>, Option<CycleValues>>,
        weights: &[u32],
    ) -> Option<CycleValues> {
        if let Some(value) = self.by_weights.get(weights) {
            return value.clone();
        }
        let value = earlier.remove(weights).unwrap_or_else(|| {
            self.written_out += 1;
            let len = kernel_wrr_cycle_len(weights)?;
            let schedule = Schedule::of_weights_within(weights, len)?;
            Some(CycleValues {
                head: VipSchedule::value_of(schedule.cycle()),
                chunks: ScheduleChunk::values_of(schedule.cycle()),
            })
        });
        self.by_weights.insert(weights.to_vec(), value.clone());
        value
    }

    /// How many cycles were written out since this was made (a test's measure).
    pub fn written_out(&self) -> u64 {
        self.written_out
    }
}

/// The maps' entries for `publication`, with `routes` and `neighbours` as
/// `/proc/net/route` and `/proc/net/arp` print them.
pub fn wanted(publication: &Publication, routes: &str, neighbours: &str) -> Wanted {
    wanted_reusing(publication, routes, neighbours, &mut WrrCycles::default())
}

/// [`wanted`], taking the wrr cycles of pools whose weights did not change from `cycles`
/// (the last call's), which then holds this publication's.
pub fn wanted_reusing(
    publication: &Publication,
    routes: &str,
    neighbours: &str,
    cycles: &mut WrrCycles,
) -> Wanted {
    let mut earlier = std::mem::take(&mut cycles.by_weights);
    let snapshot = publication.snapshot;
    let id_bits = publication.layout.id_bits();
    // Every VIP below MAX_VIPS goes into vips; an address's port vips does not hold is
    // then no VIP's only if there is none beyond.
    let every_vip = if snapshot.vips.len() <= MAX_VIPS {
        LB_EVERY_VIP
    } else {
        0
    };
    let config = LbConfigValue {
        flags: if publication.fast_path {
            LB_FAST_PATH | every_vip
        } else {
            0
        },
        mode: match snapshot.mode {
            Mode::Cheetah => LB_MODE_CHEETAH,
            Mode::Hash => LB_MODE_HASH,
            Mode::Maglev => LB_MODE_MAGLEV,
        },
        forwarding: match snapshot.forwarding {
            Forwarding::L2 => LB_FORWARDING_L2,
            Forwarding::Nat => LB_FORWARDING_NAT,
        },
        id_bits,
        id_mask: ((1u32 << id_bits) - 1) as u16,
        // The program only compares it with what it read before: the low bits do.
        generation: snapshot.generation as u32,
        fallback_mask: publication.fallback_sets.saturating_sub(1) as u32,
        ..LbConfigValue::default()
    };
    let mut wanted = Wanted {
        config,
        ..Wanted::default()
    };

    let mut backend_ports = BTreeSet::new();
    let mut chunks_left = SCHEDULE_CHUNK_BUDGET;
    for (index, vip) in snapshot.vips.iter().enumerate() {
        let std::net::IpAddr::V4(addr) = vip.address else {
            continue;
        };
        let key = AddrKey {
            addr: addr.octets(),
            copy: 0,
        };
        // What the core asks of a NAT segment from this address (a forged source: no
        // server that forwards may have it): whether a removed server had it.
        let mut flags = 0;
        if snapshot.removed_server_at(u32::from(addr)).is_some() {
            flags |= VIP_ADDR_DIP_OF_REMOVED;
        }
        wanted
            .vip_addrs
            .insert(key.to_bytes(), flags.to_ne_bytes().to_vec());
        if index >= MAX_VIPS {
            break;
        }
        let pool = &vip.pool.servers;
        // Hash mode never asks Maglev; the others do (cheetah for clients without
        // timestamps). Every table has the config's size; an empty pool has none.
        if snapshot.mode != Mode::Hash && !vip.pool.maglev.is_empty() {
            wanted.config.maglev_size = vip.pool.maglev.len() as u32;
            wanted
                .maglev
                .insert(index as u32, Arc::clone(&vip.pool.maglev));
        }
        let mut policy = kernel_policy(vip.policy, &vip.pool.weights);
        let cycle = if policy == KERNEL_POLICY_WRR {
            cycles.value_of(&mut earlier, &vip.pool.weights)
        } else {
            None
        };
        // Chunks beyond what is left of the copy's budget: this VIP's SYNs go up.
        if let Some(values) = &cycle {
            match chunks_left.checked_sub(values.chunks.len()) {
                Some(left) => chunks_left = left,
                None => policy = KERNEL_POLICY_NONE,
            }
        }
        let mut info = VipInfo {
            hash_prefix: snapshot.vip_hash_prefix(index as u16).state(),
            addr: addr.octets(),
            port: vip.port.to_be_bytes(),
            backend_port: vip.backend_port.to_be_bytes(),
            index: index as u16,
            // A bigger pool is left to userspace: the kernel picks from bounded arrays.
            pool_len: if kernel_holds_pool(pool.len()) {
                pool.len() as u16
            } else {
                0
            },
            pool: [0; MAX_HASH_POOL],
            policy,
            load_metric: kernel_load_metric(vip.pool.metric),
            pad: [0; 2],
        };
        if pool.len() <= MAX_HASH_POOL {
            for (slot, id) in info.pool.iter_mut().zip(pool) {
                *slot = id.0;
            }
        } else if kernel_holds_pool(pool.len()) {
            let ids: Vec<u16> = pool.iter().map(|id| id.0).collect();
            wanted
                .vip_big_pools
                .insert(array_key(index), VipBigPool::value_of(&ids));
        }
        // The credit scan's weights, for a pool whose per-position state the kernel holds
        // (a bigger one is served from its cycle alone).
        if info.policy == KERNEL_POLICY_WRR && pool.len() <= MAX_HASH_POOL {
            // As SmoothWeights takes them: a weight of 0 counts as 1.
            let mut weights = VipWeights {
                total: 0,
                weight: [0; MAX_HASH_POOL],
            };
            for (slot, weight) in weights.weight.iter_mut().zip(&vip.pool.weights) {
                *slot = (*weight).max(1);
                weights.total += i64::from(*slot);
            }
            wanted
                .vip_weights
                .insert(array_key(index), weights.to_bytes());
        }
        if let Some(values) = cycle.filter(|_| info.policy == KERNEL_POLICY_WRR) {
            wanted.wrr_schedules.insert(array_key(index), values.head);
            for (chunk, value) in values.chunks {
                let key = ScheduleChunkKey {
                    index: index as u16,
                    chunk,
                    copy: 0,
                };
                wanted.wrr_schedule_chunks.insert(key.to_bytes(), value);
            }
        }
        let key = VipKey {
            addr: addr.octets(),
            port: vip.port.to_be_bytes(),
            protocol: 6,
            copy: 0,
        };
        wanted.vips.insert(key.to_bytes(), info.to_bytes());
        wanted
            .vips_by_index
            .insert(array_key(index), info.to_bytes());
        if snapshot.forwarding == Forwarding::Nat {
            backend_ports.insert(vip.backend_port);
        }
    }
    // NAT: every allocated server at every backend port a VIP the kernel holds uses, in
    // any state: late replies of a removed server must still reach the core (to be
    // dropped and counted), not the host kernel. Once per port, not per VIP: the entry
    // depends on the address and port alone, and many VIPs share a port.
    for port in backend_ports {
        for (id, slot) in snapshot.servers.iter() {
            if slot.state == SlotState::Free {
                continue;
            }
            let (server, vip_index) = snapshot
                .nat_backend(slot.dip, port)
                .map_or((id.0, NO_VIP), |(server, vip_index)| (server.0, vip_index));
            let key = BackendKey {
                addr: slot.dip.to_be_bytes(),
                port: port.to_be_bytes(),
                copy: 0,
            };
            // What the core asks of a segment from this (DIP, port) that no current
            // backend explains (worker.rs `classify_rest`): drop or pass.
            let flags = match snapshot.removed_server_at(slot.dip) {
                Some(_) => BACKEND_DIP_OF_REMOVED,
                None => 0,
            };
            let value = BackendInfo {
                server,
                vip_index,
                flags,
            };
            wanted.backends.insert(key.to_bytes(), value.to_bytes());
        }
    }

    let routes = egress::RouteTable::parse(routes);
    let neighbours = egress::Neighbours::parse(neighbours);
    let ports: Vec<(String, u8)> = publication
        .interfaces
        .iter()
        .enumerate()
        .map(|(i, iface)| (iface.name.clone(), i as u8))
        .collect();
    for (id, slot) in snapshot.servers.iter() {
        if slot.state == SlotState::Free {
            continue;
        }
        let mut info = ServerInfo {
            flags: match slot.state {
                _ if slot.state.forwards() => SERVER_FORWARDS,
                SlotState::Removed => SERVER_REMOVED,
                _ => 0,
            },
            dip: slot.dip.to_be_bytes(),
            ..ServerInfo::default()
        };
        let mac = slot.has_mac.then_some(slot.mac);
        let dip = std::net::Ipv4Addr::from(slot.dip);
        if let Some(egress) = egress::resolve(dip, mac, &routes, &neighbours, &ports) {
            let iface = &publication.interfaces[egress.port as usize];
            info.flags |= SERVER_EGRESS;
            info.egress_ifindex = iface.ifindex;
            info.dst_mac = egress.dst_mac;
            info.src_mac = iface.mac;
        }
        wanted
            .servers
            .insert(array_key(id.index()), info.to_bytes());
        // The snapshot's MAC index says which of two servers sharing a MAC owns it.
        if slot.has_mac && snapshot.server_by_mac(&slot.mac) == Some(id) {
            let key = MacKey {
                mac: slot.mac,
                copy: 0,
            };
            let value = (id.0 as u32).to_ne_bytes().to_vec();
            wanted.server_macs.insert(key.to_bytes(), value);
        }
    }

    wanted.vip_slots = vip_slots::entries(&wanted.vips);
    wanted.reply_senders = reply_senders::entries(snapshot);
    // Over what vip_addrs holds, so that a clear bit is never a VIP's address.
    wanted.config.vip_addr_filter = wanted.vip_addrs.keys().fold(0, |filter, addr| {
        filter | vip_addr_bit(u32::from_be_bytes(addr[..4].try_into().unwrap()))
    });

    for (iface, side) in publication.interfaces.iter().zip(publication.sides) {
        if *side == Ingress::ServerSide {
            let slot = iface.ifindex as usize % SERVER_SIDE_SLOTS;
            // Two servers' side interfaces in one slot: the first keeps it, the other's
            // replies go to userspace (still handled, only not in the kernel).
            wanted
                .server_side
                .entry(array_key(slot))
                .or_insert_with(|| iface.ifindex.to_ne_bytes().to_vec());
        }
    }
    wanted
}

/// How a map is kept: a hash loses stale keys, an array has every index and gets a
/// zero value instead.
#[derive(Clone, Copy)]
enum Kind {
    Hash,
    Array { entries: usize, value_size: usize },
}

/// Where a map's key names its copy of the tables (`bpf/lib/publish.h`). [`Wanted`]'s keys
/// are copy 0's.
#[derive(Clone, Copy)]
enum Latch {
    /// A `u32` index: copy `c`'s is `c * entries + index` (arrays, and the hash maps keyed
    /// like them).
    Index { entries: usize },
    /// A field of the key struct at `offset`, `width` bytes, in native byte order.
    Field { offset: usize, width: usize },
}

impl Latch {
    /// `key` (copy 0's) as copy `copy`'s.
    fn key(self, key: &[u8], copy: u32) -> Vec<u8> {
        let mut key = key.to_vec();
        match self {
            Latch::Index { entries } => {
                let index = u32::from_ne_bytes(key[..4].try_into().unwrap());
                key[..4].copy_from_slice(&(copy * entries as u32 + index).to_ne_bytes());
            }
            Latch::Field { offset, width } => {
                key[offset..offset + width]
                    .copy_from_slice(&u64::from(copy).to_ne_bytes()[..width]);
            }
        }
        key
    }

    /// The copy a key of the map is in.
    fn copy_of(self, key: &[u8]) -> u32 {
        match self {
            Latch::Index { entries } => {
                u32::from_ne_bytes(key[..4].try_into().unwrap()) / entries as u32
            }
            Latch::Field { offset, width } => {
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(&key[offset..offset + width]);
                u64::from_ne_bytes(word) as u32
            }
        }
    }
}

/// Writes [`Wanted`] into a program's maps, remembering what it wrote so that the next
/// call writes only the difference; and seeds the kernel's per-CPU policy state.
#[derive(Default)]
pub struct Publisher {
    last: Option<Wanted>,
    policies: PolicySeeder,
    cycles: WrrCycles,
}

impl Publisher {
    pub fn new() -> Self {
        Self::default()
    }

    /// A publisher whose CPUs' policy instances start as `seeds` says.
    pub fn with_policy_seeds(seeds: PolicySeeds) -> Self {
        Publisher {
            last: None,
            policies: PolicySeeder::new(seeds),
            cycles: WrrCycles::default(),
        }
    }

    /// Seeds the kernel's per-CPU instance of every VIP policy `snapshot` changed since
    /// the last call (`xdp_policy.rs`); [`publish`](Self::publish) does it after writing
    /// the maps.
    pub fn seed_policies(
        &mut self,
        program: &SteeringProgram,
        snapshot: &Snapshot,
    ) -> anyhow::Result<()> {
        self.policies.seed(program, snapshot)
    }

    /// Publishes `publication` into `program`'s maps (attached or not), reading the
    /// routes and neighbours from `/proc`.
    pub fn publish(
        &mut self,
        program: &SteeringProgram,
        publication: &Publication,
    ) -> anyhow::Result<()> {
        let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        let neighbours = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
        let wanted = wanted_reusing(publication, &routes, &neighbours, &mut self.cycles);
        self.write(program, wanted)?;
        self.seed_policies(program, publication.snapshot)
    }

    /// Writes `wanted` into both copies of the tables (`publish_window.rs`): the copy
    /// packets do not read, then, after the flip, the other; every map but `lb_config`
    /// first, then `lb_config`. A publication that changes nothing writes and moves
    /// nothing.
    pub fn write(&mut self, program: &SteeringProgram, wanted: Wanted) -> anyhow::Result<()> {
        let last = self.last.take();
        if last.is_none() {
            self.policies
                .keep_seeded(kept_policies(program, &wanted)?, kept_generators(program));
        }
        // Before the window opens: building and opening tables takes milliseconds.
        let mut maglev =
            maglev_tables::plan(program, &wanted.maglev, last.as_ref().map(|l| &l.maglev))
                .context("cannot prepare the XDP program's maglev_tables")?;
        let mut window = program.publish_window()?;
        loop {
            write_copy(program, &mut window, &wanted, last.as_ref())?;
            maglev
                .apply(program, &mut window)
                .context("cannot update the XDP program's maglev_tables")?;
            if last.as_ref().map(|l| l.config) != Some(wanted.config) {
                let copy = window.before_write();
                let config = LbConfigValue {
                    copy: copy as u8,
                    publish_seq: window.seq(),
                    clock_base_ns: program.clock_base()?,
                    ..wanted.config
                };
                program
                    .try_map("lb_config")?
                    .update(&copy.to_ne_bytes(), &config.to_bytes(), MapFlags::ANY)
                    .context("cannot update the XDP program's lb_config")?;
            }
            if !window.flip() {
                break;
            }
        }
        self.last = Some(wanted);
        Ok(())
    }
}

/// A map `write_copy` writes: its name, how it is kept, where its keys name the copy, and
/// its entries wanted and last written.
type PublishedMap<'a> = (&'a str, (Kind, Latch), &'a Entries, Option<&'a Entries>);

/// Writes `wanted`'s maps (but `maglev_tables` and `lb_config`) into the copy `window`
/// writes, where they differ from `last`.
fn write_copy(
    program: &SteeringProgram,
    window: &mut PublishWindow,
    wanted: &Wanted,
    last: Option<&Wanted>,
) -> anyhow::Result<()> {
    let array = |entries: usize, value_size: usize| {
        (
            Kind::Array {
                entries,
                value_size,
            },
            Latch::Index { entries },
        )
    };
    let field = |offset: usize, width: usize| (Kind::Hash, Latch::Field { offset, width });
    let maps: [PublishedMap; 13] = [
        (
            "servers",
            array(SERVER_ID_SPACE, std::mem::size_of::<ServerInfo>()),
            &wanted.servers,
            last.map(|l| &l.servers),
        ),
        (
            "vip_weights",
            array(MAX_VIPS, std::mem::size_of::<VipWeights>()),
            &wanted.vip_weights,
            last.map(|l| &l.vip_weights),
        ),
        (
            "vip_big_pools",
            (Kind::Hash, Latch::Index { entries: MAX_VIPS }),
            &wanted.vip_big_pools,
            last.map(|l| &l.vip_big_pools),
        ),
        (
            "wrr_schedules",
            (Kind::Hash, Latch::Index { entries: MAX_VIPS }),
            &wanted.wrr_schedules,
            last.map(|l| &l.wrr_schedules),
        ),
        (
            "wrr_schedule_chunks",
            field(std::mem::offset_of!(ScheduleChunkKey, copy), 1),
            &wanted.wrr_schedule_chunks,
            last.map(|l| &l.wrr_schedule_chunks),
        ),
        (
            "vips_by_index",
            array(MAX_VIPS, std::mem::size_of::<VipInfo>()),
            &wanted.vips_by_index,
            last.map(|l| &l.vips_by_index),
        ),
        (
            "server_macs",
            field(std::mem::offset_of!(MacKey, copy), 2),
            &wanted.server_macs,
            last.map(|l| &l.server_macs),
        ),
        (
            "backends",
            field(std::mem::offset_of!(BackendKey, copy), 2),
            &wanted.backends,
            last.map(|l| &l.backends),
        ),
        (
            "reply_senders",
            array(REPLY_SLOTS, std::mem::size_of::<ReplySlot>()),
            &wanted.reply_senders,
            last.map(|l| &l.reply_senders),
        ),
        (
            "server_side",
            array(SERVER_SIDE_SLOTS, std::mem::size_of::<u32>()),
            &wanted.server_side,
            last.map(|l| &l.server_side),
        ),
        (
            "vip_addrs",
            field(std::mem::offset_of!(AddrKey, copy), 4),
            &wanted.vip_addrs,
            last.map(|l| &l.vip_addrs),
        ),
        (
            "vips",
            field(std::mem::offset_of!(VipKey, copy), 1),
            &wanted.vips,
            last.map(|l| &l.vips),
        ),
        (
            "vip_slots",
            array(VIP_SLOTS, std::mem::size_of::<VipSlot>()),
            &wanted.vip_slots,
            last.map(|l| &l.vip_slots),
        ),
    ];
    for (name, (kind, latch), entries, last) in maps {
        sync(program, window, name, kind, latch, entries, last)
            .with_context(|| format!("cannot update the XDP program's {name} map"))?;
    }
    Ok(())
}

/// The VIP indices whose policy state an earlier run left in pinned maps seeded from what
/// is wanted now: `vips_by_index` (policy, pool) and `vip_weights` hold exactly what this
/// run publishes there, so their rr cursors and wrr credits go on instead of restarting.
/// Read before the first write.
fn kept_policies(program: &SteeringProgram, wanted: &Wanted) -> anyhow::Result<Vec<usize>> {
    if !program
        .pins()
        .kept(&["policy_state", "vips_by_index", "vip_weights"])
    {
        return Ok(Vec::new());
    }
    let vips = program.try_map("vips_by_index")?;
    let weights = program.try_map("vip_weights")?;
    let no_weights = vec![0u8; weights.value_size() as usize];
    let mut kept = Vec::new();
    for (key, info) in &wanted.vips_by_index {
        let wanted_weights = wanted.vip_weights.get(key).unwrap_or(&no_weights);
        if vips.lookup(key, MapFlags::ANY)?.as_ref() == Some(info)
            && weights.lookup(key, MapFlags::ANY)?.as_ref() == Some(wanted_weights)
        {
            kept.push(u32::from_ne_bytes(key[..4].try_into()?) as usize);
        }
    }
    Ok(kept)
}

/// Whether the kernel's generators are an earlier run's (pinned): they go on.
fn kept_generators(program: &SteeringProgram) -> bool {
    program.pins().kept(&["policy_rng"])
}

/// Makes the copy `window` writes of map `name` hold exactly `entries` (copy 0's keys).
/// `last` is what this publisher wrote before (`None`: unknown, so a hash map's keys are
/// read and every array index is written).
fn sync(
    program: &SteeringProgram,
    window: &mut PublishWindow,
    name: &str,
    kind: Kind,
    latch: Latch,
    entries: &Entries,
    last: Option<&Entries>,
) -> anyhow::Result<()> {
    let map = program.try_map(name)?;
    let copy = window.copy();
    for (key, value) in entries {
        if last.and_then(|l| l.get(key)) != Some(value) {
            window.before_write();
            map.update(&latch.key(key, copy), value, MapFlags::ANY)?;
        }
    }
    match kind {
        Kind::Hash => {
            let wanted: std::collections::BTreeSet<Vec<u8>> =
                entries.keys().map(|k| latch.key(k, copy)).collect();
            let stale: Vec<Vec<u8>> = map
                .keys()
                .filter(|k| {
                    // A key of no copy (an earlier layout's) is stale in every one.
                    let of = latch.copy_of(k);
                    (of == copy || of as usize >= PUBLISH_COPIES) && !wanted.contains(k)
                })
                .collect();
            for key in stale {
                window.before_write();
                map.delete(&key)?;
            }
        }
        Kind::Array {
            entries: count,
            value_size,
        } => {
            let zero = vec![0u8; value_size];
            let stale: Vec<Vec<u8>> = match last {
                Some(last) => last
                    .keys()
                    .filter(|k| !entries.contains_key(*k))
                    .map(|k| latch.key(k, copy))
                    .collect(),
                None => (0..count)
                    .map(array_key)
                    .filter(|k| !entries.contains_key(k))
                    .map(|k| latch.key(&k, copy))
                    .collect(),
            };
            // One system call for them all: a fresh publisher zeroes every unused slot of
            // reply_senders (2^16) and vip_slots (2^13), which one call each would make slow.
            if !stale.is_empty() {
                window.before_write();
                let values = zero.repeat(stale.len());
                map.update_batch(
                    &stale.concat(),
                    &values,
                    stale.len() as u32,
                    MapFlags::ANY,
                    MapFlags::ANY,
                )?;
            }
        }
    }
    Ok(())
}

/// Publishes once with a fresh [`Publisher`] (every entry written): for a program that
/// is loaded but not attached, e.g. the parity test's.
pub fn publish(program: &SteeringProgram, publication: &Publication) -> anyhow::Result<()> {
    Publisher::new().publish(program, publication)
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use cheetah_core::config::{ConfiguredState, LbConfig};
    use cheetah_core::hash::Secret;
    use cheetah_core::policy::schedule::SCHEDULE_MAX_POSITIONS;
    use cheetah_core::tables::{ControlPlane, ServerSpec};
    use cheetah_core::testkit;

    use super::*;

    /// The testbed LB's routes and neighbours (`egress.rs` reads the same forms).
    const ROUTES: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
lb-c\t00000000\t01010A0A\t0003\t0\t0\t0\t00000000\t0\t0\t0
lb-s\t0000140A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
";
    const ARP: &str =
        "IP address       HW type     Flags       HW address            Mask     Device
10.20.0.12       0x1         0x2         02:ce:00:00:02:02     *        lb-s
";

    fn interfaces() -> Vec<Interface> {
        ["lb-c", "lb-s"]
            .iter()
            .enumerate()
            .map(|(i, name)| Interface {
                name: name.to_string(),
                ifindex: 10 + i as u32,
                mac: [2, 0xb0, 0, 0, 0, i as u8],
                slot: i as u32,
                queues: 1,
            })
            .collect()
    }

    fn plane(extra: &str) -> ControlPlane {
        let config = LbConfig::from_toml(&format!(
            r#"
            {extra}
            [[servers]]
            id = 1
            dip = "10.20.0.11"
            mac = "02:ce:00:00:02:01"
            [[servers]]
            id = 2
            dip = "10.20.0.12"
            mac = "02:ce:00:00:02:02"
            [[servers]]
            id = 3
            dip = "10.99.0.13"
            mac = "02:ce:00:00:02:03"
            state = "draining"
            [[vips]]
            address = "10.0.0.100"
            port = 80
            servers = [1, 2, 3]
            "#
        ))
        .unwrap();
        ControlPlane::new(&config, &Secret([5; 16])).unwrap()
    }

    fn wanted_of(plane: &ControlPlane, fast_path: bool) -> Wanted {
        wanted_of_reusing(plane, fast_path, &mut WrrCycles::default())
    }

    fn wanted_of_reusing(plane: &ControlPlane, fast_path: bool, cycles: &mut WrrCycles) -> Wanted {
        let snapshot = plane.shared().snapshot.load();
        let interfaces = interfaces();
        let publication = Publication {
            snapshot: &snapshot,
            layout: plane.layout(),
            interfaces: &interfaces,
            sides: &[Ingress::ClientSide, Ingress::ServerSide],
            fast_path,
            fallback_sets: 64,
        };
        wanted_reusing(&publication, ROUTES, ARP, cycles)
    }

    fn server(wanted: &Wanted, id: u16) -> ServerInfo {
        let bytes = &wanted.servers[&array_key(id as usize)];
        let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        ServerInfo {
            flags: word(offset_of!(ServerInfo, flags)),
            dip: bytes[4..8].try_into().unwrap(),
            egress_ifindex: word(offset_of!(ServerInfo, egress_ifindex)),
            dst_mac: bytes[12..18].try_into().unwrap(),
            src_mac: bytes[18..24].try_into().unwrap(),
        }
    }

    #[test]
    fn the_config_word_says_mode_forwarding_layout_and_fast_path() {
        let plane = plane("cookie_epoch_bits = 4");
        let on = wanted_of(&plane, true).config;
        assert_eq!(on.flags, LB_FAST_PATH | LB_EVERY_VIP);
        assert_eq!(
            (on.mode, on.forwarding),
            (LB_MODE_CHEETAH, LB_FORWARDING_L2)
        );
        assert_eq!((on.id_bits, on.id_mask), (12, 0x0fff));
        assert_eq!(on.generation as u64, plane.generation());
        assert_eq!(on.fallback_mask, 63, "the fallback table's sets - 1");
        assert_eq!(
            on.clock_base_ns, 0,
            "the clock's base is not the publication's"
        );
        let off = wanted_of(&plane, false).config;
        assert_eq!(off.flags, 0, "datapath = afxdp: the program only steers");
        let hash = wanted_of(&self::plane("mode = \"hash\"\nforwarding = \"nat\""), true).config;
        assert_eq!(
            (hash.mode, hash.forwarding),
            (LB_MODE_HASH, LB_FORWARDING_NAT)
        );
    }

    #[test]
    fn a_snapshot_with_more_vips_than_the_kernel_holds_says_so() {
        let vips = |n: usize| -> String {
            (0..n)
                .map(|i| {
                    format!(
                        "[[vips]]\naddress = \"10.0.0.100\"\nport = {}\nservers = [1]\n",
                        1000 + i
                    )
                })
                .collect()
        };
        // With the plane's own VIP: MAX_VIPS, then one more.
        let at_most = wanted_of(&plane(&vips(MAX_VIPS - 1)), true).config;
        assert_eq!(at_most.flags, LB_FAST_PATH | LB_EVERY_VIP);
        let beyond = wanted_of(&plane(&vips(MAX_VIPS)), true).config;
        assert_eq!(beyond.flags, LB_FAST_PATH, "a VIP vips does not hold");
    }

    #[test]
    fn servers_carry_their_state_and_their_resolved_egress() {
        let plane = plane("");
        let published = wanted_of(&plane, true);
        let lb_s = &interfaces()[1];
        // A configured MAC needs only the route.
        let one = server(&published, 1);
        assert_eq!(one.flags, SERVER_FORWARDS | SERVER_EGRESS);
        assert_eq!(one.dip, [10, 20, 0, 11]);
        assert_eq!(one.egress_ifindex, lb_s.ifindex);
        assert_eq!(one.dst_mac, [2, 0xce, 0, 0, 2, 1]);
        assert_eq!(one.src_mac, lb_s.mac);
        // Draining still forwards; behind the default route, it leaves through lb-c.
        let three = server(&published, 3);
        assert_eq!(three.flags, SERVER_FORWARDS | SERVER_EGRESS);
        assert_eq!(three.egress_ifindex, interfaces()[0].ifindex);
        assert_eq!(published.servers.len(), 3, "free ids are not written");
        // No route at all: no egress, so the kernel leaves its packets to userspace.
        let no_routes = {
            let snapshot = plane.shared().snapshot.load();
            let interfaces = interfaces();
            let publication = Publication {
                snapshot: &snapshot,
                layout: plane.layout(),
                interfaces: &interfaces,
                sides: &[Ingress::ClientSide, Ingress::ServerSide],
                fast_path: true,
                fallback_sets: 64,
            };
            wanted(&publication, "", "")
        };
        assert_eq!(server(&no_routes, 1).flags, SERVER_FORWARDS);
        assert_eq!(server(&no_routes, 1).egress_ifindex, 0);
    }

    #[test]
    fn vips_carry_the_cores_hash_prefix_and_pool() {
        let plane = plane("mode = \"hash\"");
        let wanted = wanted_of(&plane, true);
        let snapshot = plane.shared().snapshot.load();
        let key = VipKey {
            addr: [10, 0, 0, 100],
            port: 80u16.to_be_bytes(),
            protocol: 6,
            copy: 0,
        };
        let info = &wanted.vips[&key.to_bytes()];
        assert_eq!(info, &wanted.vips_by_index[&array_key(0)]);
        let prefix = snapshot.vip_hash_prefix(0).state();
        let at = offset_of!(VipInfo, hash_prefix);
        assert_eq!(
            info[at..at + 8],
            prefix[0].to_ne_bytes(),
            "the prefix as the core keeps it"
        );
        let pool_len = offset_of!(VipInfo, pool_len);
        let pool = &snapshot.vips[0].pool.servers;
        assert_eq!(
            info[pool_len..pool_len + 2],
            (pool.len() as u16).to_ne_bytes()
        );
        let first = offset_of!(VipInfo, pool);
        assert_eq!(info[first..first + 2], pool[0].0.to_ne_bytes());
    }

    #[test]
    fn the_kernel_runs_every_policy_for_pools_it_holds_and_maglev_for_any() {
        use PolicyKind::*;
        let equal = |len: usize| vec![1u32; len];
        for (kind, expected) in [
            (RoundRobin, KERNEL_POLICY_RR),
            (WeightedRoundRobin, KERNEL_POLICY_WRR),
            (Random, KERNEL_POLICY_RANDOM),
            (Hash, KERNEL_POLICY_HASH),
            (PowerOfTwo, KERNEL_POLICY_POW2),
            (LeastLoaded, KERNEL_POLICY_LEAST_LOADED),
            (Maglev, KERNEL_POLICY_MAGLEV),
            (AutoWeightedRoundRobin, KERNEL_POLICY_AWRR),
        ] {
            assert_eq!(kernel_policy(kind, &equal(3)), expected, "{kind}");
            assert_eq!(
                kernel_policy(kind, &equal(MAX_HASH_POOL)),
                expected,
                "{kind}"
            );
            assert_eq!(kernel_policy(kind, &[]), KERNEL_POLICY_EMPTY, "{kind}");
            // Beyond vip_info, in vip_big_pools: wrr and awrr from their cycle, which names
            // at most SCHEDULE_CAP positions (every one MAX_BIG_POOL holds); awrr's always
            // fits, over 819 servers by scaled buckets.
            for len in [
                MAX_HASH_POOL + 1,
                819,
                820,
                256,
                257,
                SCHEDULE_MAX_POSITIONS,
                MAX_BIG_POOL,
            ] {
                let big = match kind {
                    WeightedRoundRobin if len > SCHEDULE_MAX_POSITIONS => KERNEL_POLICY_NONE,
                    _ => expected,
                };
                assert_eq!(kernel_policy(kind, &equal(len)), big, "{kind} {len}");
            }
            let beyond = if kind == Maglev {
                KERNEL_POLICY_MAGLEV
            } else {
                KERNEL_POLICY_NONE
            };
            assert_eq!(
                kernel_policy(kind, &equal(MAX_BIG_POOL + 1)),
                beyond,
                "{kind}"
            );
        }
        // wrr over 64 servers only with a cycle the kernel reads: odd weights 1, 3, .., 127
        // and one of 13,000 make one of 17,096 entries, over SCHEDULE_CAP, in two chunks;
        // with one of 600,000, one of 604,096, over SCHEDULE_MAX_LEN; 1, 2, 1, 2, .. one
        // of 98.
        let odd = |last: u32| -> Vec<u32> {
            (0..MAX_HASH_POOL as u32)
                .map(|i| 2 * i + 1)
                .chain([last])
                .collect()
        };
        assert_eq!(
            kernel_policy(WeightedRoundRobin, &odd(13_000)),
            KERNEL_POLICY_WRR
        );
        assert_eq!(kernel_wrr_cycle_len(&odd(13_000)), Some(17_096));
        assert_eq!(
            kernel_policy(WeightedRoundRobin, &odd(600_000)),
            KERNEL_POLICY_NONE
        );
        // Within 64 servers the kernel scans the credits of a cycle over SCHEDULE_CAP.
        assert_eq!(kernel_wrr_cycle_len(&odd(13_000)[1..]), None);
        let alternating: Vec<u32> = (0..MAX_HASH_POOL as u32 + 1).map(|i| 1 + i % 2).collect();
        assert_eq!(
            kernel_policy(WeightedRoundRobin, &alternating),
            KERNEL_POLICY_WRR
        );
        // Over 256 servers, positions beyond a byte: weights 1 to 5 over 300 and 1,000
        // servers make cycles of 900 and 3,000 entries; 1 to 40 over 1,000 one of 20,500,
        // over SCHEDULE_CAP (in chunks); 1 to 300 over 16,384 one of 2,465,668, over
        // SCHEDULE_MAX_LEN; 1 to 100 over 10,000 one of 505,000 under it, but 100 distinct
        // weights make 50.5 M steps to write it out, over MAX_CYCLE_STEPS.
        let cycling =
            |servers: u32, top: u32| -> Vec<u32> { (0..servers).map(|i| 1 + i % top).collect() };
        for servers in [300, 1000] {
            assert_eq!(
                kernel_policy(WeightedRoundRobin, &cycling(servers, 5)),
                KERNEL_POLICY_WRR,
                "{servers}"
            );
        }
        assert_eq!(
            kernel_policy(WeightedRoundRobin, &cycling(1000, 40)),
            KERNEL_POLICY_WRR
        );
        assert_eq!(
            kernel_policy(WeightedRoundRobin, &cycling(16_384, 300)),
            KERNEL_POLICY_NONE
        );
        assert_eq!(kernel_wrr_cycle_len(&cycling(10_000, 100)), None);
        assert_eq!(kernel_wrr_cycle_len(&cycling(10_000, 50)), Some(255_000));
        // Every metric's loads are in each CPU's view (the metric does not decide).
        for (metric, expected) in [
            (LoadMetric::ActiveConnections, LOAD_METRIC_ACTIVE),
            (LoadMetric::Reported, LOAD_METRIC_REPORTED),
            (LoadMetric::Packets, LOAD_METRIC_PACKETS),
            (LoadMetric::Bytes, LOAD_METRIC_BYTES),
        ] {
            assert_eq!(kernel_load_metric(metric), expected, "{metric:?}");
        }
    }

    #[test]
    fn a_wrr_vip_carries_its_policy_and_its_weights() {
        let config = LbConfig::from_toml(
            r#"
            [[servers]]
            id = 1
            dip = "10.20.0.11"
            mac = "02:ce:00:00:02:01"
            [[servers]]
            id = 2
            dip = "10.20.0.12"
            mac = "02:ce:00:00:02:02"
            [[vips]]
            address = "10.0.0.100"
            port = 80
            policy = "wrr"
            servers = [1, 2]
            [vips.weights]
            "2" = 5
            "#,
        )
        .unwrap();
        let plane = ControlPlane::new(&config, &Secret([5; 16])).unwrap();
        let wanted = wanted_of(&plane, true);
        let info = &wanted.vips_by_index[&array_key(0)];
        assert_eq!(info[offset_of!(VipInfo, policy)], KERNEL_POLICY_WRR);
        let weights = &wanted.vip_weights[&array_key(0)];
        let word = |at: usize| u32::from_ne_bytes(weights[at..at + 4].try_into().unwrap());
        let first = offset_of!(VipWeights, weight);
        assert_eq!((word(first), word(first + 4)), (1, 5));
        assert_eq!(weights[..8], 6i64.to_ne_bytes(), "the total");
        // Not a wrr VIP: no weights.
        assert!(wanted_of(&self::plane(""), true).vip_weights.is_empty());
    }

    #[test]
    fn a_wrr_vip_over_256_servers_carries_its_cycle_in_16_bit_positions() {
        let mut config = testkit::config(
            Mode::Cheetah,
            Forwarding::L2,
            PolicyKind::WeightedRoundRobin,
            300,
        );
        let weights: Vec<u32> = (0..300).map(|i| 1 + i % 5).collect();
        for (id, weight) in (1..=300u16).zip(&weights) {
            config.vips[0].weights.insert(id.to_string(), *weight);
        }
        let plane = ControlPlane::new(&config, &Secret([5; 16])).unwrap();
        let wanted = wanted_of(&plane, true);
        let info = &wanted.vips_by_index[&array_key(0)];
        assert_eq!(info[offset_of!(VipInfo, policy)], KERNEL_POLICY_WRR);
        // Read from its cycle alone: no credits' weights.
        assert!(wanted.vip_weights.is_empty());
        assert!(wanted.vip_big_pools.contains_key(&array_key(0)));
        let value = &wanted.wrr_schedules[&array_key(0)];
        assert_eq!(value.len(), std::mem::size_of::<VipSchedule>());
        assert_eq!(value[..4], 900u32.to_ne_bytes());
        let first = offset_of!(VipSchedule, position);
        let positions: Vec<u16> = value[first..first + 2 * 900]
            .chunks(2)
            .map(|p| u16::from_ne_bytes([p[0], p[1]]))
            .collect();
        assert_eq!(positions, Schedule::of_weights(&weights).unwrap().cycle());
        assert_eq!(positions.iter().max(), Some(&299));
    }

    #[test]
    fn a_wrr_cycle_is_written_out_again_only_when_its_weights_change() {
        let mut config = testkit::config(
            Mode::Cheetah,
            Forwarding::L2,
            PolicyKind::WeightedRoundRobin,
            300,
        );
        for id in 1..=300u16 {
            config.vips[0]
                .weights
                .insert(id.to_string(), 1 + u32::from(id) % 5);
        }
        // A second wrr VIP with other weights, and a third with the first's: one cycle.
        let mut second = config.vips[0].clone();
        second.port += 1;
        second.servers = (1..=20).collect();
        second.weights = (1..=20u16)
            .map(|id| (id.to_string(), 1 + u32::from(id) % 3))
            .collect();
        let mut third = config.vips[0].clone();
        third.port += 2;
        config.vips.extend([second, third]);
        let first_vip = format!("{}:{}", config.vips[0].address, config.vips[0].port);
        let mut plane = ControlPlane::new(&config, &Secret([5; 16])).unwrap();
        let mut cycles = WrrCycles::default();

        let cold = wanted_of_reusing(&plane, true, &mut cycles);
        assert_eq!(cold, wanted_of(&plane, true));
        assert_eq!(cold.wrr_schedules.len(), 3);
        assert_eq!(cycles.written_out(), 2, "one per distinct set of weights");
        assert_eq!(wanted_of_reusing(&plane, true, &mut cycles), cold);
        assert_eq!(
            cycles.written_out(),
            2,
            "nothing changed: nothing written out"
        );

        plane.set_weights(&first_vip, &[(7, 40)]).unwrap();
        let changed = wanted_of_reusing(&plane, true, &mut cycles);
        assert_eq!(changed, wanted_of(&plane, true));
        assert_ne!(
            changed.wrr_schedules[&array_key(0)],
            cold.wrr_schedules[&array_key(0)]
        );
        assert_eq!(cycles.written_out(), 3, "only the changed pool's cycle");
    }

    /// A wrr config of `vips` VIPs (ports 80 on) over servers 1 to `servers`, each with
    /// the weights `weight(id)`.
    fn wrr_config(vips: u16, servers: u16, weight: impl Fn(u16) -> u32) -> LbConfig {
        let mut config = testkit::config(
            Mode::Cheetah,
            Forwarding::L2,
            PolicyKind::WeightedRoundRobin,
            servers,
        );
        config.vips[0].weights = (1..=servers)
            .map(|id| (id.to_string(), weight(id)))
            .collect();
        let first = config.vips[0].clone();
        config.vips.extend((1..vips).map(|n| {
            let mut vip = first.clone();
            vip.port += n;
            vip
        }));
        config
    }

    #[test]
    fn a_wrr_cycle_over_the_cap_is_published_in_chunks() {
        // Weights 1 to 40 over 1,000 servers: a cycle of 20,500 entries, 16,384 in
        // wrr_schedules and the rest in chunk 1.
        let config = wrr_config(1, 1000, |id| 1 + u32::from(id - 1) % 40);
        let plane = ControlPlane::new(&config, &Secret([5; 16])).unwrap();
        let wanted = wanted_of(&plane, true);
        let weights: Vec<u32> = (1..=1000u16).map(|id| 1 + u32::from(id - 1) % 40).collect();
        let cycle = Schedule::of_weights_within(&weights, SCHEDULE_MAX_LEN).unwrap();
        assert_eq!(cycle.len(), 20_500);
        let positions = |bytes: &[u8]| -> Vec<u16> {
            bytes
                .chunks(2)
                .map(|p| u16::from_ne_bytes([p[0], p[1]]))
                .collect()
        };
        let head = &wanted.wrr_schedules[&array_key(0)];
        let len_at = std::mem::offset_of!(VipSchedule, len);
        assert_eq!(head[len_at..len_at + 4], 20_500u32.to_ne_bytes());
        let at = std::mem::offset_of!(VipSchedule, position);
        assert_eq!(positions(&head[at..]), cycle.cycle()[..SCHEDULE_CAP]);
        assert_eq!(wanted.wrr_schedule_chunks.len(), 1);
        let key = ScheduleChunkKey {
            index: 0,
            chunk: 1,
            copy: 0,
        };
        let chunk = positions(&wanted.wrr_schedule_chunks[&key.to_bytes()]);
        assert_eq!(
            chunk[..20_500 - SCHEDULE_CAP],
            cycle.cycle()[SCHEDULE_CAP..]
        );
        assert!(chunk[20_500 - SCHEDULE_CAP..].iter().all(|&p| p == 0));
        let info = &wanted.vips_by_index[&array_key(0)];
        assert_eq!(
            info[std::mem::offset_of!(VipInfo, policy)],
            KERNEL_POLICY_WRR
        );
    }

    #[test]
    fn wrr_cycles_beyond_the_chunk_budget_leave_their_vips_to_userspace() {
        // 64 servers of weight 1 and one of 524,224: a cycle of SCHEDULE_MAX_LEN entries,
        // 31 chunks beyond the first. 33 such VIPs take 1,023 of the 1,024 chunks.
        let config = wrr_config(35, 65, |id| if id == 65 { 524_224 } else { 1 });
        let plane = ControlPlane::new(&config, &Secret([5; 16])).unwrap();
        let wanted = wanted_of(&plane, true);
        let fitting = SCHEDULE_CHUNK_BUDGET / (SCHEDULE_CHUNKS - 1);
        assert_eq!(fitting, 33);
        assert_eq!(
            wanted.wrr_schedule_chunks.len(),
            fitting * (SCHEDULE_CHUNKS - 1)
        );
        for index in 0..35 {
            let info = &wanted.vips_by_index[&array_key(index)];
            let expected = if index < fitting {
                KERNEL_POLICY_WRR
            } else {
                KERNEL_POLICY_NONE
            };
            assert_eq!(
                info[std::mem::offset_of!(VipInfo, policy)],
                expected,
                "VIP {index}"
            );
            assert_eq!(
                wanted.wrr_schedules.contains_key(&array_key(index)),
                index < fitting,
                "VIP {index}"
            );
        }
    }

    #[test]
    fn l2_servers_are_found_by_mac_and_nat_backends_by_address() {
        let l2 = wanted_of(&plane(""), true);
        let key = MacKey {
            mac: [2, 0xce, 0, 0, 2, 2],
            copy: 0,
        };
        assert_eq!(l2.server_macs[&key.to_bytes()], 2u32.to_ne_bytes());
        assert!(l2.backends.is_empty());
        let nat = wanted_of(&plane("forwarding = \"nat\""), true);
        let key = BackendKey {
            addr: [10, 20, 0, 12],
            port: 80u16.to_be_bytes(),
            copy: 0,
        };
        let value = BackendInfo {
            server: 2,
            vip_index: 0,
            flags: 0,
        };
        assert_eq!(nat.backends[&key.to_bytes()], value.to_bytes());
        assert_eq!(nat.backends.len(), 3);
    }

    /// What the kernel asks of a NAT segment from a VIP address: whether a removed server had
    /// it (a quarantine kept across a restart whose config put a VIP at that address; no
    /// server that forwards can have it).
    #[test]
    fn a_vip_address_says_whether_a_removed_server_had_it() {
        let mut plane = plane("forwarding = \"nat\"");
        let key = AddrKey {
            addr: [10, 0, 0, 100],
            copy: 0,
        };
        let flags = |plane: &ControlPlane| {
            let published = wanted_of(plane, true);
            u32::from_ne_bytes(
                published.vip_addrs[&key.to_bytes()][..4]
                    .try_into()
                    .unwrap(),
            )
        };
        assert_eq!(flags(&plane), 0);
        let vip = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 100));
        plane
            .restore_quarantine(&testkit::removed_server_state(9, vip), 0)
            .unwrap();
        assert_eq!(flags(&plane), VIP_ADDR_DIP_OF_REMOVED);
    }

    #[test]
    fn only_server_side_interfaces_take_replies() {
        let wanted = wanted_of(&plane(""), true);
        let entries: Vec<(&Vec<u8>, &Vec<u8>)> = wanted.server_side.iter().collect();
        let ifindex = 11u32.to_ne_bytes().to_vec();
        assert_eq!(entries, [(&ifindex, &ifindex)]);
    }

    #[test]
    fn a_removed_server_stops_forwarding_but_its_nat_replies_still_go_up() {
        let mut plane = plane("forwarding = \"nat\"");
        plane.remove_server(2, 0).unwrap();
        let published = wanted_of(&plane, true);
        assert_eq!(server(&published, 2).flags & SERVER_FORWARDS, 0);
        let key = BackendKey {
            addr: [10, 20, 0, 12],
            port: 80u16.to_be_bytes(),
            copy: 0,
        };
        let info = &published.backends[&key.to_bytes()];
        assert_eq!(info[2..4], NO_VIP.to_ne_bytes(), "no VIP claims it");
        let flags = |published: &Wanted, dip: [u8; 4]| {
            let key = BackendKey {
                addr: dip,
                port: 80u16.to_be_bytes(),
                copy: 0,
            };
            let info = &published.backends[&key.to_bytes()];
            u32::from_ne_bytes(info[4..8].try_into().unwrap())
        };
        assert_eq!(flags(&published, [10, 20, 0, 12]), BACKEND_DIP_OF_REMOVED);
        assert_eq!(flags(&published, [10, 20, 0, 11]), 0);
        // The server back under a new id at the same DIP, a current backend again: what
        // no current backend explains from that DIP is still the removed server's to drop.
        let back = plane
            .add_server(
                ServerSpec {
                    id: Some(4),
                    dip: "10.20.0.12".parse().unwrap(),
                    mac: Some("02:ce:00:00:02:04".into()),
                    vips: vec![("10.0.0.100:80".into(), 1)],
                    state: ConfiguredState::Active,
                },
                0,
            )
            .unwrap();
        let published = wanted_of(&plane, true);
        let info = &published.backends[&key.to_bytes()];
        assert_eq!(info[0..2], back.0.to_ne_bytes(), "the current backend's");
        assert_ne!(info[2..4], NO_VIP.to_ne_bytes());
        assert_eq!(flags(&published, [10, 20, 0, 12]), BACKEND_DIP_OF_REMOVED);
    }
}
