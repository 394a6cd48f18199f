//! The `reply_senders` array (`bpf/lib/reply_sender.h`): a server's reply to its sender in
//! one read, before any steering lookup, each sender at the slot its key hashes to. Its
//! senders are only what the old way (steering, then `server_macs` and `vips`, or
//! `backends` and `vips_by_index`, then `servers`) would find for the same packet, so a hit
//! forwards exactly as before; whatever is left out (a sender whose slot another took, the
//! first in key order keeping it) is found the old way.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cheetah_core::config::Forwarding;
use cheetah_core::tables::{ServerSlot, SlotState, Snapshot};
use cheetah_core::types::ServerId;

use super::xdp_layout::{
    Encode, ReplyKey, ReplySender, ReplySlot, MAX_VIPS, REPLY_SLOT_BITS, REPLY_SLOT_MULTIPLIER,
};

/// `reply_slot_of` in reply_sender.h: the slot of `key`, from its three words as they lie
/// in memory.
pub fn slot_of(key: &ReplyKey) -> usize {
    let bytes = key.to_bytes();
    let word = |i: usize| {
        u64::from(u32::from_ne_bytes(
            bytes[4 * i..4 * i + 4].try_into().unwrap(),
        ))
    };
    let x = (word(1) << 32 | word(0)).wrapping_mul(REPLY_SLOT_MULTIPLIER);
    ((x ^ word(2)).wrapping_mul(REPLY_SLOT_MULTIPLIER) >> (64 - REPLY_SLOT_BITS)) as usize
}

/// `reply_senders`' entries for `snapshot`: slot index -> `struct reply_slot` bytes.
pub fn entries(snapshot: &Snapshot) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut slots = BTreeMap::new();
    for (key, sender) in senders(snapshot) {
        let slot = (slot_of(&key) as u32).to_ne_bytes().to_vec();
        slots.entry(slot).or_insert_with(|| {
            ReplySlot {
                key,
                used: 1,
                sender,
                pad: 0,
            }
            .to_bytes()
        });
    }
    slots
}

/// Every sender the old way would find for a reply the kernel may forward, in key order.
fn senders(snapshot: &Snapshot) -> Vec<(ReplyKey, ReplySender)> {
    let mut entries = BTreeMap::new();
    // The VIPs the `vips` map holds, as the kernel reads them: the last one published at
    // an (address, port) is the one found there.
    let mut published: BTreeMap<([u8; 4], u16), usize> = BTreeMap::new();
    let mut vip_addrs = BTreeSet::new();
    for (index, vip) in snapshot.vips.iter().enumerate() {
        let IpAddr::V4(addr) = vip.address else {
            continue;
        };
        vip_addrs.insert(addr.octets());
        if index < MAX_VIPS {
            published.insert((addr.octets(), vip.port), index);
        }
    }
    // The VIP at `index` as vips_by_index holds it (every IPv4 VIP below MAX_VIPS).
    let sender = |index: usize, server: ServerId| -> Option<ReplySender> {
        let vip = snapshot.vips.get(index).filter(|_| index < MAX_VIPS)?;
        let IpAddr::V4(addr) = vip.address else {
            return None;
        };
        Some(ReplySender {
            hash_prefix: snapshot.vip_hash_prefix(index as u16).state(),
            vip_addr: addr.octets(),
            vip_port: vip.port.to_be_bytes(),
            server: server.0,
        })
    };
    let forwards = |slot: &ServerSlot| slot.state.forwards();
    let mut add = |key: ReplyKey, value: ReplySender| {
        entries.insert(key.to_bytes(), (key, value));
    };
    match snapshot.forwarding {
        Forwarding::L2 => {
            for &index in published.values() {
                let vip = &snapshot.vips[index];
                // Whoever may still answer for the VIP: its pool, draining members and
                // departed servers.
                let serving: BTreeSet<ServerId> = vip
                    .pool
                    .servers
                    .iter()
                    .copied()
                    .chain(vip.members.iter().map(|(id, _)| *id))
                    .chain(vip.departed.iter().copied())
                    .collect();
                for id in serving {
                    let slot = snapshot.servers.get(id);
                    // The server the MAC index names, as server_macs holds it.
                    if !forwards(slot)
                        || !slot.has_mac
                        || snapshot.server_by_mac(&slot.mac) != Some(id)
                    {
                        continue;
                    }
                    let Some(value) = sender(index, id) else {
                        continue;
                    };
                    let key = ReplyKey {
                        addr: value.vip_addr,
                        port: value.vip_port,
                        mac: slot.mac,
                    };
                    add(key, value);
                }
            }
        }
        Forwarding::Nat => {
            // The backends map's keys: every allocated server at every published VIP's
            // backend port.
            let backend_ports: BTreeSet<u16> = snapshot
                .vips
                .iter()
                .take(MAX_VIPS)
                .filter(|vip| vip.address.is_ipv4())
                .map(|vip| vip.backend_port)
                .collect();
            for port in backend_ports {
                for (_, slot) in snapshot.servers.iter() {
                    if slot.state == SlotState::Free {
                        continue;
                    }
                    // Steering takes a segment from a VIP's address for an l2 reply, never
                    // for a backend's.
                    if vip_addrs.contains(&slot.dip.to_be_bytes()) {
                        continue;
                    }
                    let Some((server, vip_index)) = snapshot.nat_backend(slot.dip, port) else {
                        continue;
                    };
                    if !forwards(snapshot.servers.get(server)) {
                        continue;
                    }
                    let Some(value) = sender(vip_index as usize, server) else {
                        continue;
                    };
                    let key = ReplyKey {
                        addr: slot.dip.to_be_bytes(),
                        port: port.to_be_bytes(),
                        mac: [0; 6],
                    };
                    add(key, value);
                }
            }
        }
    }
    entries.into_values().collect()
}

#[cfg(test)]
mod tests {
    use cheetah_core::config::LbConfig;
    use cheetah_core::hash::Secret;
    use cheetah_core::tables::ControlPlane;

    use super::*;

    /// Servers 1 and 2 serve the VIP, 3 is draining out of it, 4 serves no VIP.
    fn plane(forwarding: &str) -> ControlPlane {
        let config = LbConfig::from_toml(&format!(
            r#"
            forwarding = "{forwarding}"
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
            dip = "10.20.0.13"
            mac = "02:ce:00:00:02:03"
            state = "draining"
            [[servers]]
            id = 4
            dip = "10.20.0.14"
            mac = "02:ce:00:00:02:04"
            [[vips]]
            address = "10.0.0.100"
            port = 80
            backend_port = 8080
            servers = [1, 2, 3]
            "#
        ))
        .unwrap();
        ControlPlane::new(&config, &Secret([5; 16])).unwrap()
    }

    /// The server and VIP (address, port) of `key`'s slot, if it holds `key`.
    fn sender_of(entries: &BTreeMap<Vec<u8>, Vec<u8>>, key: ReplyKey) -> Option<(u16, [u8; 6])> {
        let slot = (slot_of(&key) as u32).to_ne_bytes().to_vec();
        let bytes = entries.get(&slot)?;
        if bytes[..12] != key.to_bytes()[..] || bytes[12..16] != 1u32.to_ne_bytes() {
            return None;
        }
        let sender = &bytes[16..56];
        let server = u16::from_ne_bytes(sender[38..40].try_into().unwrap());
        Some((server, sender[32..38].try_into().unwrap()))
    }

    #[test]
    fn l2_replies_are_known_by_the_servers_mac_and_the_vips_address_and_port() {
        let plane = plane("l2");
        let snapshot = plane.shared().snapshot.load();
        let entries = entries(&snapshot);
        let key = |mac: u8| ReplyKey {
            addr: [10, 0, 0, 100],
            port: 80u16.to_be_bytes(),
            mac: [2, 0xce, 0, 0, 2, mac],
        };
        let vip = [10, 0, 0, 100, 0, 80];
        for id in [1, 2, 3] {
            assert_eq!(sender_of(&entries, key(id as u8)), Some((id, vip)));
        }
        assert_eq!(
            entries.len(),
            3,
            "server 4 serves no VIP: found the old way"
        );
        // The VIP's hash prefix, as vips holds it.
        let slot = (slot_of(&key(1)) as u32).to_ne_bytes().to_vec();
        let value = &entries[&slot][16..56];
        let prefix: Vec<u8> = snapshot
            .vip_hash_prefix(0)
            .state()
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        assert_eq!(value[..32], prefix[..]);
    }

    #[test]
    fn nat_replies_are_known_by_the_backends_address_and_port() {
        let plane = plane("nat");
        let snapshot = plane.shared().snapshot.load();
        let entries = entries(&snapshot);
        let key = |last: u8| ReplyKey {
            addr: [10, 20, 0, last],
            port: 8080u16.to_be_bytes(),
            mac: [0; 6],
        };
        let vip = [10, 0, 0, 100, 0, 80];
        for id in [1, 2, 3] {
            assert_eq!(sender_of(&entries, key(10 + id as u8)), Some((id, vip)));
        }
        assert_eq!(entries.len(), 3, "server 4 is no VIP's backend");
    }

    #[test]
    fn a_server_that_no_longer_forwards_is_found_the_old_way() {
        for forwarding in ["l2", "nat"] {
            let mut plane = plane(forwarding);
            plane.remove_server(2, 0).unwrap();
            let snapshot = plane.shared().snapshot.load();
            let entries = entries(&snapshot);
            let servers: BTreeSet<u16> = entries
                .values()
                .map(|v| u16::from_ne_bytes(v[16 + 38..16 + 40].try_into().unwrap()))
                .collect();
            assert_eq!(servers, BTreeSet::from([1, 3]), "{forwarding}");
        }
    }
}
