//! One worker: the per-core pipeline that every I/O backend drives.
//!
//! ```text
//!  parse ─► classify ─┬─ client → VIP ─► SYN: policy pick      ─┐
//!                     │                  other: cookie decode, ├─► rewrite toward server
//!                     │                  restore TSecr         ─┘   (dst MAC, or NAT)
//!                     ├─ server → client ─► learn clock, cookie into TSval ─► (NAT) ─► client
//!                     ├─ ICMP error → VIP ─► cookie of the embedded packet ─► server
//!                     └─ anything else ─► Pass (host kernel)
//! ```
//! `process` takes the packet buffer and `now`; randomness comes from the seed given at
//! construction. The worker owns what only it writes (policy cursors, load deltas,
//! counters) and reads what all workers share through [`LbShared`] (which the no-timestamp
//! fallback table is part of: a connection's packets reach several workers).

use std::sync::Arc;

use rand_core::SeedableRng;

use super::counters::{Counter, WorkerCounters};
use super::ingress::Ingress;
use super::rate_limit::TokenBucket;
use super::shared::LbShared;
use crate::config::{Forwarding, Mode};
use crate::policy::hash::pick_modulo;
use crate::policy::{self, Policy, PolicyRng, PoolSnapshot, WorkerLoads};
use crate::tables::Snapshot;
use crate::types::{Nanos, ServerId};
use crate::verdict::{DropReason, Verdict};
use crate::wire::ethernet::ethertype;
use crate::wire::tcp_options::{self, SegmentKind, TimestampLookup};
use crate::wire::{ip_proto, read_u16, tcp, EthernetFrame, Ipv4Packet, Ipv6Packet, TcpSegment};

/// Per-worker settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// This worker's index among `workers` (round-robin cursors start here).
    pub index: usize,
    pub workers: usize,
    /// Seed of the policy RNG; with the same seed and packets a run replays exactly.
    pub seed: u64,
    pub icmp_copy_rate: u64,
    pub icmp_copy_burst: u64,
}

impl WorkerConfig {
    pub fn new(index: usize, workers: usize, config: &crate::config::LbConfig) -> Self {
        WorkerConfig {
            index,
            workers,
            seed: 0x5eed_0000 + index as u64,
            icmp_copy_rate: config.icmp_copy_rate,
            icmp_copy_burst: config.icmp_copy_burst,
        }
    }
}

/// A VIP's policy instance on this worker.
pub(crate) struct VipPolicy {
    pub(crate) policy: Box<dyn Policy>,
    pub(crate) pool: Arc<PoolSnapshot>,
}

/// Everything a worker writes. Split from the snapshot so a path can borrow both.
pub(crate) struct WorkerState {
    pub(crate) index: usize,
    pub(crate) workers: usize,
    pub(crate) policies: Vec<VipPolicy>,
    pub(crate) loads: WorkerLoads,
    pub(crate) rng: PolicyRng,
    pub(crate) icmp_copies: TokenBucket,
    pub(crate) counters: Arc<WorkerCounters>,
    /// Whether established traffic takes `lb/fast_path.rs`: asked for and not ruled out by
    /// the restore fault, which only the general path injects (so the straight line does
    /// not test for it on every packet).
    pub(crate) fast_path: bool,
    /// What `Worker::set_fast_path` asked for (off only to test the straight line against
    /// the general pipeline).
    fast_path_wanted: bool,
    /// Whether the TSecr of client packets is given back the server's MSB (off only to
    /// show that the live tests catch a server seeing cookies in TSecr).
    pub(crate) restore_tsecr: bool,
}

pub struct Worker {
    shared: Arc<LbShared>,
    snapshot: Arc<Snapshot>,
    /// `snapshot.generation`, kept beside the pointer so the per-packet check is one load
    /// from the shared cell and one compare.
    generation: u64,
    pub(crate) state: WorkerState,
}

/// The server a reply comes from, and the VIP it answers for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sender {
    pub(crate) server: ServerId,
    pub(crate) vip: u16,
    /// NAT mode: the source is the server's DIP and must become the VIP.
    pub(crate) nat: bool,
}

/// Where the IPv4 header and its payload sit in the frame, and its addresses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ipv4Layout {
    pub(crate) l3: usize,
    pub(crate) l4: usize,
    pub(crate) end: usize,
    pub(crate) src: u32,
    pub(crate) dst: u32,
}

impl WorkerState {
    /// The TCP timestamp option, counting which path found it.
    #[inline]
    pub(crate) fn find_timestamp(
        &self,
        options: &[u8],
        kind: SegmentKind,
    ) -> Result<TimestampLookup, DropReason> {
        let lookup = tcp_options::find_timestamp(options, kind)?;
        self.counters.inc(if lookup.fast_path {
            Counter::OptionsFastPath
        } else {
            Counter::OptionsSlowPath
        });
        Ok(lookup)
    }
}

/// Where the baseline modes send every packet: `pool[h % n]` or the Maglev table.
#[inline]
pub(crate) fn baseline_pick(mode: Mode, pool: &PoolSnapshot, flow_hash: u64) -> Option<ServerId> {
    match mode {
        Mode::Hash => pick_modulo(&pool.servers, flow_hash),
        Mode::Maglev | Mode::Cheetah => pool.maglev.lookup(flow_hash),
    }
}

impl Ipv4Layout {
    #[inline]
    pub(crate) fn of(l3: usize, ip: &Ipv4Packet<&[u8]>) -> Self {
        Ipv4Layout {
            l3,
            l4: l3 + ip.header_len(),
            end: l3 + ip.total_len(),
            src: ip.src(),
            dst: ip.dst(),
        }
    }
}

impl Worker {
    pub fn new(shared: Arc<LbShared>, config: WorkerConfig) -> Self {
        let snapshot = shared.snapshot.load();
        let mut worker = Worker {
            state: WorkerState {
                index: config.index,
                workers: config.workers.max(1),
                policies: Vec::new(),
                loads: WorkerLoads::new(Arc::clone(&shared.loads)),
                rng: PolicyRng::seed_from_u64(config.seed),
                icmp_copies: TokenBucket::new(config.icmp_copy_rate, config.icmp_copy_burst),
                counters: Arc::new(WorkerCounters::default()),
                fast_path: true,
                fast_path_wanted: true,
                restore_tsecr: true,
            },
            shared,
            snapshot: Arc::new(Snapshot::empty()),
            generation: 0,
        };
        worker.install(snapshot);
        worker
    }

    /// Turns the established-client fast path off or on; the verdicts and bytes must be the
    /// same either way (differential tests use this).
    pub fn set_fast_path(&mut self, enabled: bool) {
        self.state.fast_path_wanted = enabled;
        self.state.fast_path = enabled && self.state.restore_tsecr;
    }

    /// **Fault injection, for tests only.** With `false` the worker still routes client
    /// packets by their cookie but leaves the cookie in TSecr instead of restoring the
    /// server's MSB, so servers see TSecr values they never sent. The live timestamp test
    /// turns this on (`cheetah run --fault skip-tsecr-restore`) to prove that its check
    /// fails when the restore is missing. Never turn it off in production. While it is off,
    /// every packet takes the general pipeline.
    pub fn set_restore_tsecr(&mut self, enabled: bool) {
        self.state.restore_tsecr = enabled;
        self.state.fast_path = self.state.fast_path_wanted && enabled;
    }

    pub fn counters(&self) -> &Arc<WorkerCounters> {
        &self.state.counters
    }

    pub fn shared(&self) -> &Arc<LbShared> {
        &self.shared
    }

    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// Picks up a new snapshot and merges load counters when due. `process` calls it for
    /// every packet; an idle I/O loop calls it so merges keep their 10 ms cadence.
    #[inline(always)]
    pub fn tick(&mut self, now: Nanos) {
        if self.shared.snapshot.generation() != self.generation {
            let snapshot = self.shared.snapshot.load();
            self.install(snapshot);
        }
        if self.state.loads.merge_due(now) {
            self.merge_loads(now);
        }
    }

    #[cold]
    fn merge_loads(&mut self, now: Nanos) {
        let state = &mut self.state;
        state.loads.merge(now);
        for vip in &mut state.policies {
            vip.policy.on_loads_merged(&vip.pool, state.loads.view());
        }
        state.counters.inc(Counter::LoadMerges);
    }

    /// Rebuilds per-VIP policy instances for a new snapshot, keeping the ones whose pool
    /// and policy did not change so round-robin cursors and WRR credits carry on.
    #[cold]
    fn install(&mut self, snapshot: Arc<Snapshot>) {
        let state = &mut self.state;
        let mut previous: Vec<Option<VipPolicy>> = std::mem::take(&mut state.policies)
            .into_iter()
            .map(Some)
            .collect();
        let mut watched = Vec::new();
        for vip in &snapshot.vips {
            let kept = previous.iter_mut().find_map(|slot| {
                let same = slot.as_ref().is_some_and(|old| {
                    old.policy.kind() == vip.policy
                        && old.pool.servers == vip.pool.servers
                        && old.pool.weights == vip.pool.weights
                        && old.pool.metric == vip.pool.metric
                });
                if same {
                    slot.take()
                } else {
                    None
                }
            });
            let entry = match kept {
                Some(mut old) => {
                    old.pool = Arc::clone(&vip.pool);
                    old
                }
                None => VipPolicy {
                    policy: policy::build(vip.policy, &vip.pool, state.index, state.workers),
                    pool: Arc::clone(&vip.pool),
                },
            };
            state.policies.push(entry);
            watched.extend(vip.members.iter().map(|m| m.0));
        }
        state.loads.watch(&watched);
        for vip in &mut state.policies {
            vip.policy.on_loads_merged(&vip.pool, state.loads.view());
        }
        self.generation = snapshot.generation;
        self.snapshot = snapshot;
        state.counters.inc(Counter::SnapshotReloads);
    }

    /// Runs one packet that arrived on a port of the `ingress` side through the pipeline,
    /// rewriting it in place.
    #[inline]
    pub fn process(&mut self, packet: &mut [u8], now: Nanos, ingress: Ingress) -> Verdict {
        self.tick(now);
        match (
            self.snapshot.mode == Mode::Cheetah,
            self.snapshot.forwarding,
        ) {
            (true, Forwarding::L2) => self.process_ticked::<true, false>(packet, now, ingress),
            (true, Forwarding::Nat) => self.process_ticked::<true, true>(packet, now, ingress),
            (false, Forwarding::L2) => self.process_ticked::<false, false>(packet, now, ingress),
            (false, Forwarding::Nat) => self.process_ticked::<false, true>(packet, now, ingress),
        }
    }

    /// Runs a burst of packets received together on a port of the `ingress` side,
    /// rewriting each in place and handing its
    /// verdict to `verdict`, in order. The same as [`process`](Self::process) on each
    /// packet with the same `now` (what a receive loop passes for one burst), except that
    /// the snapshot and merge checks are made once for the burst: a snapshot published
    /// while the burst runs is picked up by the next one. The per-packet call and its
    /// register saves go too, and the mode and forwarding are matched once: the straight
    /// line compiled for them runs in this loop.
    #[inline]
    pub fn process_batch<'p>(
        &mut self,
        packets: impl IntoIterator<Item = &'p mut [u8]>,
        now: Nanos,
        ingress: Ingress,
        mut verdict: impl FnMut(Verdict),
    ) {
        self.tick(now);
        let packets = packets.into_iter();
        match (
            self.snapshot.mode == Mode::Cheetah,
            self.snapshot.forwarding,
        ) {
            (true, Forwarding::L2) => {
                packets.for_each(|p| verdict(self.process_ticked::<true, false>(p, now, ingress)))
            }
            (true, Forwarding::Nat) => {
                packets.for_each(|p| verdict(self.process_ticked::<true, true>(p, now, ingress)))
            }
            (false, Forwarding::L2) => {
                packets.for_each(|p| verdict(self.process_ticked::<false, false>(p, now, ingress)))
            }
            (false, Forwarding::Nat) => {
                packets.for_each(|p| verdict(self.process_ticked::<false, true>(p, now, ingress)))
            }
        }
    }

    /// One packet after `tick`; `CHEETAH` and `NAT` say the snapshot's mode and forwarding.
    #[inline(always)]
    fn process_ticked<const CHEETAH: bool, const NAT: bool>(
        &mut self,
        packet: &mut [u8],
        now: Nanos,
        ingress: Ingress,
    ) -> Verdict {
        if self.state.fast_path {
            // Counts its own verdicts.
            if let Some(verdict) = self.state.established_fast::<CHEETAH, NAT>(
                &self.snapshot,
                &self.shared,
                packet,
                now,
                ingress,
            ) {
                return verdict;
            }
        }
        let verdict = self.classify(packet, now, ingress);
        self.state.counters.count_verdict(verdict);
        verdict
    }

    /// The general pipeline: every packet the straight line declines. Out of line, so the
    /// straight line keeps its registers for itself.
    #[inline(never)]
    fn classify(&mut self, packet: &mut [u8], now: Nanos, ingress: Ingress) -> Verdict {
        let frame = match EthernetFrame::new_checked(&*packet) {
            Ok(frame) => frame,
            Err(reason) => return Verdict::Drop(reason),
        };
        let l3 = frame.payload_offset();
        match frame.ethertype() {
            ethertype::IPV4 => {}
            ethertype::IPV6 => return self.classify_ipv6(&packet[l3..]),
            _ => return Verdict::Pass,
        }
        let src_mac = frame.src_mac();
        let (layout, protocol, fragment) = match Ipv4Packet::new_checked(&packet[l3..]) {
            Ok(ip) => (Ipv4Layout::of(l3, &ip), ip.protocol(), ip.is_fragment()),
            Err(reason) => return Verdict::Drop(reason),
        };
        let (src, dst) = (layout.src, layout.dst);
        let snapshot = &*self.snapshot;
        let shared = &*self.shared;
        // The common case first, one index lookup per direction: a TCP segment to a VIP
        // port, or a reply from a server.
        if protocol == ip_proto::TCP && !fragment && layout.l4 + 4 <= layout.end {
            let src_port = read_u16(packet, layout.l4);
            let dst_port = read_u16(packet, layout.l4 + tcp::field::DST_PORT);
            if let Some(vip) = snapshot.vip_index(dst, dst_port) {
                return self
                    .state
                    .client_tcp(snapshot, shared, packet, layout, vip, now);
            }
            // A segment to a VIP's address is never a reply, whatever its source claims:
            // `classify_rest` takes it as traffic to the VIP.
            let sender = match snapshot.forwarding {
                _ if snapshot.is_vip_addr(dst) => None,
                Forwarding::L2 => snapshot.vip_index(src, src_port).map(|vip| {
                    snapshot.server_by_mac(&src_mac).map(|server| Sender {
                        server,
                        vip,
                        nat: false,
                    })
                }),
                Forwarding::Nat => snapshot.nat_backend(src, src_port).map(|(server, vip)| {
                    Some(Sender {
                        server,
                        vip,
                        nat: true,
                    })
                }),
            };
            match sender {
                // Before anything is learnt from it.
                Some(Some(_)) if ingress == Ingress::ClientSide => {
                    return Verdict::Drop(DropReason::ReplyFromClientSide)
                }
                Some(Some(sender)) => {
                    return self
                        .state
                        .server_tcp(snapshot, shared, packet, layout, sender, now)
                }
                Some(None) => return Verdict::Drop(DropReason::UnknownServerSource),
                None => {}
            }
        }
        self.classify_rest(packet, layout, protocol, fragment, &src_mac, now)
    }

    /// Everything but the common TCP case: ICMP errors, unsupported traffic to a VIP,
    /// malformed segments, and what belongs to the host.
    #[cold]
    fn classify_rest(
        &mut self,
        packet: &mut [u8],
        layout: Ipv4Layout,
        protocol: u8,
        fragment: bool,
        src_mac: &crate::types::Mac,
        now: Nanos,
    ) -> Verdict {
        let snapshot = &*self.snapshot;
        let shared = &*self.shared;
        let tcp_reason =
            |packet: &[u8]| match TcpSegment::new_checked(&packet[layout.l4..layout.end]) {
                Ok(_) => DropReason::VipPortUnknown,
                Err(reason) => reason,
            };
        if snapshot.is_vip_addr(layout.dst) {
            if fragment {
                return Verdict::Drop(DropReason::UnsupportedFragment);
            }
            return match protocol {
                ip_proto::TCP => Verdict::Drop(tcp_reason(packet)),
                ip_proto::ICMP => self
                    .state
                    .client_icmp(snapshot, shared, packet, layout, now),
                ip_proto::UDP => Verdict::Drop(DropReason::UnsupportedUdp),
                _ => Verdict::Drop(DropReason::UnsupportedProtocol),
            };
        }
        if snapshot.forwarding == Forwarding::Nat
            && protocol == ip_proto::TCP
            && snapshot.removed_server_at(layout.src).is_some()
        {
            return Verdict::Drop(DropReason::ServerRemoved);
        }
        if snapshot.forwarding == Forwarding::L2 && snapshot.is_vip_addr(layout.src) {
            if snapshot.server_by_mac(src_mac).is_none() {
                return Verdict::Drop(DropReason::UnknownServerSource);
            }
            if fragment {
                return Verdict::Drop(DropReason::UnsupportedFragment);
            }
            return match protocol {
                ip_proto::TCP => Verdict::Drop(tcp_reason(packet)),
                _ => Verdict::ToClient,
            };
        }
        Verdict::Pass
    }

    #[cold]
    fn classify_ipv6(&self, l3: &[u8]) -> Verdict {
        match Ipv6Packet::new_checked(l3) {
            Ok(ip) if self.snapshot.is_vip_addr_v6(&ip.dst_addr()) => {
                Verdict::Drop(DropReason::UnsupportedIpv6)
            }
            Ok(_) => Verdict::Pass,
            Err(reason) => Verdict::Drop(reason),
        }
    }

    /// Rewrites an unmodified copy of a [`Verdict::ToAllServers`] packet for one server.
    pub fn prepare_copy(&self, packet: &mut [u8], vip: u16, server: ServerId) {
        self.state
            .prepare_icmp_copy(&self.snapshot, packet, vip, server)
    }

    /// The servers a [`Verdict::ToAllServers`] packet is copied to.
    pub fn copy_targets(&self, vip: u16) -> &[ServerId] {
        &self.snapshot.vip(vip).pool.servers
    }

    pub fn mode(&self) -> Mode {
        self.snapshot.mode
    }
}
