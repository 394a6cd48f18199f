//! One immutable view of AllServers and VIPToServers, as the data path reads it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::index::FlatIndex;
use super::servers::{AllServers, SlotState};
use crate::config::{Forwarding, Mode};
use crate::hash::{FlowHasher, VipHashPrefix};
use crate::policy::{PolicyKind, PoolSnapshot};
use crate::types::{Mac, ServerId};

/// A VIP and the pool its new connections are spread over.
#[derive(Debug)]
pub struct VipEntry {
    pub address: IpAddr,
    pub port: u16,
    pub policy: PolicyKind,
    /// Servers accepting new connections, their weights, the Maglev table.
    pub pool: Arc<PoolSnapshot>,
    /// Every configured member with its weight, draining ones included.
    pub members: Vec<(ServerId, u32)>,
    /// Servers that left the pool but still serve their connections.
    pub departed: Vec<ServerId>,
    /// Server-side port in NAT mode.
    pub backend_port: u16,
}

impl VipEntry {
    /// The IPv4 address (IPv6 VIPs never reach the IPv4 paths, which look them up by a
    /// 32-bit address).
    #[inline]
    pub fn ipv4_or_zero(&self) -> u32 {
        match self.address {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(_) => 0,
        }
    }
}

/// What the VIP index holds for an IPv4 TCP VIP: its index in [`Snapshot::vips`] and its
/// side of the flow hash. The prefix is kept beside the index, not only in the per-VIP
/// table, so that a packet's hash can start as soon as the VIP's slot is found, without
/// first loading the index to find the prefix (the straight line's hash chain is its
/// longest).
#[derive(Clone, Copy, Debug)]
pub struct VipSlot {
    pub index: u16,
    pub hash_prefix: VipHashPrefix,
}

/// What the MAC index holds for a server: its id, whether it forwards, and the key and slot
/// of the first IPv4 TCP VIP it serves (most servers serve one), so that an l2 reply from
/// that VIP finds its sender, the sender's state and its VIP with one lookup instead of
/// three.
#[derive(Clone, Copy, Debug)]
pub struct MacEntry {
    pub server: ServerId,
    /// The server's state forwards packets of existing connections (copied from
    /// AllServers, which this same snapshot holds), so an l2 reply needs no AllServers load.
    pub forwards: bool,
    /// `addr_port` of the server's first VIP; `u64::MAX` (never a VIP's key) if it has none.
    first_vip_key: u64,
    first_vip: VipSlot,
}

impl MacEntry {
    /// The VIP at `addr:port` if it is the server's first; `None` says nothing about the
    /// server's other VIPs (look them up in the VIP index).
    #[inline(always)]
    pub fn first_vip_at(&self, addr: u32, port: u16) -> Option<&VipSlot> {
        (self.first_vip_key == addr_port(addr, port)).then_some(&self.first_vip)
    }
}

/// Everything the data path consults, built by the control plane, never mutated.
#[derive(Debug)]
pub struct Snapshot {
    pub generation: u64,
    pub mode: Mode,
    pub forwarding: Forwarding,
    pub servers: AllServers,
    pub vips: Vec<VipEntry>,
    /// Per VIP (same index), the flow hash's state after the VIP's side of the id.
    vip_hash_prefixes: Vec<VipHashPrefix>,
    /// IPv4 TCP VIPs by address and port, each with a copy of its hash prefix.
    vip_by_addr_port: FlatIndex<VipSlot>,
    vip_addrs: FlatIndex<()>,
    /// Bit `a & 63` set for every IPv4 VIP address `a`: every server reply asks whether it
    /// is addressed to a VIP, and one bit test answers "no" for most addresses that are
    /// not, before the index is looked at.
    vip_addr_filter: u64,
    vip_addrs_v6: Vec<Ipv6Addr>,
    server_by_mac: FlatIndex<MacEntry>,
    /// `(DIP << 16 | backend port)` -> (server, VIP index), for NAT replies.
    nat_backends: FlatIndex<(ServerId, u16)>,
    /// DIPs of removed servers, so their late NAT replies are dropped and counted rather
    /// than handed to the host untranslated.
    removed_dips: FlatIndex<ServerId>,
}

/// The bit of `addr` (an IPv4 address as a number) in [`Snapshot`]'s VIP address filter,
/// and in the XDP program's (`lb_config.vip_addr_filter`, bpf/lib/vip_addr_filter.h).
#[inline(always)]
pub fn vip_addr_bit(addr: u32) -> u64 {
    1 << (addr & 63)
}

#[inline]
fn addr_port(addr: u32, port: u16) -> u64 {
    ((addr as u64) << 16) | port as u64
}

fn vip_hash_prefix(hasher: &FlowHasher, vip: &VipEntry) -> VipHashPrefix {
    hasher.vip_prefix(vip.ipv4_or_zero(), vip.port, crate::wire::ip_proto::TCP)
}

#[inline]
fn mac_key(mac: &Mac) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(mac);
    u64::from_le_bytes(b)
}

impl Snapshot {
    pub fn new(
        generation: u64,
        mode: Mode,
        forwarding: Forwarding,
        servers: AllServers,
        vips: Vec<VipEntry>,
        hasher: &FlowHasher,
    ) -> Self {
        let vip_hash_prefixes: Vec<VipHashPrefix> = vips
            .iter()
            .map(|vip| vip_hash_prefix(hasher, vip))
            .collect();
        let mut by_addr_port = Vec::new();
        let mut addrs = Vec::new();
        let mut vip_addrs_v6 = Vec::new();
        let mut nat_backends = Vec::new();
        for (index, vip) in vips.iter().enumerate() {
            match vip.address {
                IpAddr::V4(a) => {
                    let a = u32::from(a);
                    let slot = VipSlot {
                        index: index as u16,
                        hash_prefix: vip_hash_prefixes[index],
                    };
                    by_addr_port.push((addr_port(a, vip.port), slot));
                    addrs.push((a as u64, ()));
                    for id in vip.members.iter().map(|m| &m.0).chain(&vip.departed) {
                        let dip = servers.get(*id).dip;
                        nat_backends.push((addr_port(dip, vip.backend_port), (*id, index as u16)));
                    }
                }
                IpAddr::V6(a) => vip_addrs_v6.push(a),
            }
        }
        // Never read: it only fills the indexes' empty slots.
        let filler = VipSlot {
            index: u16::MAX,
            hash_prefix: hasher.vip_prefix(0, 0, 0),
        };
        let no_vip = (u64::MAX, filler);
        // Per server, the first IPv4 VIP it serves (as a member or as departed).
        let mut first_vips: HashMap<ServerId, (u64, VipSlot)> = HashMap::new();
        for &(key, slot) in &by_addr_port {
            let vip = &vips[slot.index as usize];
            for id in vip
                .members
                .iter()
                .map(|m| m.0)
                .chain(vip.departed.iter().copied())
            {
                first_vips.entry(id).or_insert((key, slot));
            }
        }
        // A removed server keeps its MAC entry so its late replies are dropped and counted,
        // but an operator may add the same machine back under a new id while the old one
        // is quarantined: the index keeps the last of duplicate keys, so the removed come
        // first and the server that forwards owns the MAC.
        let removed_first = servers
            .iter()
            .filter(|(_, slot)| slot.has_mac && slot.state == SlotState::Removed)
            .chain(
                servers
                    .iter()
                    .filter(|(_, slot)| slot.has_mac && slot.state != SlotState::Removed),
            );
        let by_mac = removed_first.map(|(id, slot)| {
            let (first_vip_key, first_vip) = first_vips.get(&id).copied().unwrap_or(no_vip);
            let entry = MacEntry {
                server: id,
                forwards: slot.state.forwards(),
                first_vip_key,
                first_vip,
            };
            (mac_key(&slot.mac), entry)
        });
        let mac_filler = MacEntry {
            server: ServerId(0),
            forwards: false,
            first_vip_key: no_vip.0,
            first_vip: no_vip.1,
        };
        Snapshot {
            generation,
            mode,
            forwarding,
            vip_hash_prefixes,
            vip_by_addr_port: FlatIndex::build_with_filler(by_addr_port, filler),
            vip_addr_filter: addrs
                .iter()
                .fold(0, |filter, &(a, ())| filter | vip_addr_bit(a as u32)),
            vip_addrs: FlatIndex::build(addrs),
            vip_addrs_v6,
            server_by_mac: FlatIndex::build_with_filler(by_mac, mac_filler),
            nat_backends: FlatIndex::build(nat_backends),
            removed_dips: FlatIndex::build(
                servers
                    .iter()
                    .filter(|(_, slot)| slot.state == SlotState::Removed)
                    .map(|(id, slot)| (slot.dip as u64, id)),
            ),
            servers,
            vips,
        }
    }

    /// An empty snapshot: no servers, no VIPs (everything passes to the host).
    pub fn empty() -> Self {
        // No VIP, so no prefix: the key is never used.
        let unused = FlowHasher::new(&crate::hash::Secret([0; 16]));
        Snapshot::new(
            0,
            Mode::Cheetah,
            Forwarding::L2,
            AllServers::default(),
            Vec::new(),
            &unused,
        )
    }

    /// Index of the IPv4 TCP VIP at `addr:port`.
    #[inline]
    pub fn vip_index(&self, addr: u32, port: u16) -> Option<u16> {
        self.vip_slot(addr, port).map(|slot| slot.index)
    }

    /// The IPv4 TCP VIP at `addr:port`: its index and its side of the flow hash.
    #[inline]
    pub fn vip_slot(&self, addr: u32, port: u16) -> Option<&VipSlot> {
        self.vip_by_addr_port.find(addr_port(addr, port))
    }

    /// Whether `addr` is the address of any VIP (on any port).
    #[inline]
    pub fn is_vip_addr(&self, addr: u32) -> bool {
        self.vip_addr_filter & vip_addr_bit(addr) != 0 && self.vip_addrs.contains(addr as u64)
    }

    pub fn is_vip_addr_v6(&self, addr: &Ipv6Addr) -> bool {
        self.vip_addrs_v6.contains(addr)
    }

    /// The server whose NIC has this MAC (l2 replies).
    #[inline]
    pub fn server_by_mac(&self, mac: &Mac) -> Option<ServerId> {
        self.mac_entry(mac).map(|entry| entry.server)
    }

    /// [`server_by_mac`](Snapshot::server_by_mac) with the server's first VIP.
    #[inline(always)]
    pub fn mac_entry(&self, mac: &Mac) -> Option<&MacEntry> {
        self.server_by_mac.find(mac_key(mac))
    }

    /// The server and VIP a NAT reply from `dip:port` belongs to.
    #[inline]
    pub fn nat_backend(&self, dip: u32, port: u16) -> Option<(ServerId, u16)> {
        self.nat_backends.get(addr_port(dip, port))
    }

    /// The removed server whose DIP this is, if no current backend claims the reply.
    #[inline]
    pub fn removed_server_at(&self, dip: u32) -> Option<ServerId> {
        self.removed_dips.get(dip as u64)
    }

    pub fn vip(&self, index: u16) -> &VipEntry {
        &self.vips[index as usize]
    }

    /// The flow hash's state after the TCP VIP at `index`'s side of the id: finishing it
    /// with the client's address and port gives `FlowHasher::hash` of the connection, as
    /// long as this snapshot was built with the worker's hasher (`LbShared::hasher`).
    #[inline]
    pub fn vip_hash_prefix(&self, index: u16) -> &VipHashPrefix {
        &self.vip_hash_prefixes[index as usize]
    }
}

/// Where the control plane publishes snapshots and workers pick them up.
///
/// Workers hold their own `Arc<Snapshot>` and compare [`generation`](Self::generation)
/// (one plain load on x86) per packet; only when it moved do they load the new snapshot.
/// Holding the Arc instead of re-loading it per packet keeps the reference count's cache
/// line out of the per-packet path.
pub struct SnapshotCell {
    current: ArcSwap<Snapshot>,
    generation: AtomicU64,
}

impl SnapshotCell {
    pub fn new(snapshot: Snapshot) -> Self {
        let generation = AtomicU64::new(snapshot.generation);
        SnapshotCell {
            current: ArcSwap::from_pointee(snapshot),
            generation,
        }
    }

    pub fn publish(&self, snapshot: Snapshot) {
        let generation = snapshot.generation;
        self.current.store(Arc::new(snapshot));
        self.generation.store(generation, Ordering::Release);
    }

    /// Generation of the latest published snapshot.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Forwarding, Mode, VipConfig};
    use crate::hash::{FlowKey, Secret};
    use crate::policy::PolicyKind;
    use crate::tables::ControlPlane;
    use crate::testkit;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[test]
    fn vip_slots_carry_their_vips_index_and_hash_prefix() {
        let mut config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 4);
        let template = config.vips[0].clone();
        let vip = |address: IpAddr, port| VipConfig {
            address,
            port,
            ..template.clone()
        };
        for port in [443, 8080] {
            config.vips.push(vip(template.address, port));
        }
        config.vips.push(vip(Ipv6Addr::LOCALHOST.into(), 80));
        for n in 1..40u32 {
            config
                .vips
                .push(vip(Ipv4Addr::from(0x0a00_0100 + n).into(), 80));
        }
        let plane = ControlPlane::new(&config, &Secret([9; 16])).unwrap();
        let shared = plane.shared();
        let snapshot = shared.snapshot.load();
        let mut found = 0;
        for (index, vip) in snapshot.vips.iter().enumerate() {
            let IpAddr::V4(address) = vip.address else {
                continue;
            };
            let address = u32::from(address);
            let slot = snapshot
                .vip_slot(address, vip.port)
                .expect("an IPv4 VIP is indexed");
            assert_eq!(slot.index as usize, index);
            for (client, port) in [(testkit::client_ip(1), 40000), (0xc0a8_0105, 1)] {
                let key = FlowKey::tcp(client, port, address, vip.port);
                let whole = shared.hasher.hash(&key);
                assert_eq!(slot.hash_prefix.finish(client, port), whole);
                assert_eq!(
                    snapshot.vip_hash_prefix(slot.index).finish(client, port),
                    whole
                );
            }
            assert!(snapshot.vip_slot(address, vip.port ^ 1).is_none());
            found += 1;
        }
        assert_eq!(found, 42);
    }

    /// The straight line trusts the MAC entry's copy of the server's state; every snapshot
    /// the lifecycle publishes must keep the copy equal to AllServers.
    #[test]
    fn mac_entries_carry_the_servers_forwarding_state() {
        let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 4);
        let mut plane = ControlPlane::new(&config, &Secret([9; 16])).unwrap();
        let check = |plane: &ControlPlane, expected: [bool; 4]| {
            let snapshot = plane.shared().snapshot.load();
            let mut seen = 0;
            for (id, slot) in snapshot.servers.iter().filter(|(_, slot)| slot.has_mac) {
                let entry = snapshot
                    .mac_entry(&slot.mac)
                    .expect("a server's MAC is indexed");
                assert_eq!(entry.server, id);
                assert_eq!(entry.forwards, slot.state.forwards(), "server {}", id.0);
                assert_eq!(entry.forwards, expected[id.index() - 1], "server {}", id.0);
                seen += 1;
            }
            assert_eq!(seen, 4, "every server keeps its MAC entry");
        };
        check(&plane, [true; 4]);
        plane.drain_server(2).unwrap();
        check(&plane, [true, true, true, true]);
        plane.remove_server(3, 1).unwrap();
        check(&plane, [true, true, false, true]);
        plane.activate_server(2).unwrap();
        check(&plane, [true, true, false, true]);
    }
}
