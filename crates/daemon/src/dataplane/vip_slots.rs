//! The `vip_slots` array (`bpf/lib/vip_slots.h`): the VIPs of `vips` again, each at the
//! slot its (address, port) hashes to, with what a client's established segment needs
//! of it (its hash prefix and ports), so that such a segment finds its VIP by one array
//! read. The first VIP (in `vips`' key order) to hash to a slot takes it; a VIP whose slot
//! is taken is found in `vips`, where every VIP is.

use std::collections::BTreeMap;

use std::mem::offset_of;

use super::xdp_layout::{
    Encode, VipInfo, VipSlot, VIP_SLOT_BITS, VIP_SLOT_MULTIPLIER, VIP_SLOT_USED,
};

/// `vip_slot_of` in vip_slots.h: `addr` and `port` as the packet carries them (network
/// byte order), read as numbers on this host.
pub fn slot_of(addr: [u8; 4], port: [u8; 2]) -> usize {
    let (addr, port) = (u32::from_ne_bytes(addr), u16::from_ne_bytes(port));
    ((addr ^ (u32::from(port) << 16)).wrapping_mul(VIP_SLOT_MULTIPLIER) >> (32 - VIP_SLOT_BITS))
        as usize
}

/// The tag of the slot holding the VIP at (`addr`, `port`).
pub fn tag_of(addr: [u8; 4], port: [u8; 2]) -> u64 {
    VIP_SLOT_USED | u64::from(u16::from_ne_bytes(port)) << 32 | u64::from(u32::from_ne_bytes(addr))
}

/// `vip_slots`' entries (slot index -> `struct vip_slot` bytes) for `vips`' entries
/// (`struct vip_key` bytes -> `struct vip_info` bytes).
pub fn entries(vips: &BTreeMap<Vec<u8>, Vec<u8>>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut slots = BTreeMap::new();
    for (key, info) in vips {
        let addr: [u8; 4] = key[0..4].try_into().unwrap();
        let port: [u8; 2] = key[4..6].try_into().unwrap();
        let slot = (slot_of(addr, port) as u32).to_ne_bytes().to_vec();
        slots.entry(slot).or_insert_with(|| {
            let field = |at: usize, len: usize| &info[at..at + len];
            let mut value = VipSlot {
                tag: tag_of(addr, port),
                port: field(offset_of!(VipInfo, port), 2).try_into().unwrap(),
                backend_port: field(offset_of!(VipInfo, backend_port), 2)
                    .try_into()
                    .unwrap(),
                ..VipSlot::default()
            };
            for (i, word) in value.hash_prefix.iter_mut().enumerate() {
                let at = offset_of!(VipInfo, hash_prefix) + 8 * i;
                *word = u64::from_ne_bytes(field(at, 8).try_into().unwrap());
            }
            value.to_bytes()
        });
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(addr: [u8; 4], port: u16) -> Vec<u8> {
        let mut key = addr.to_vec();
        key.extend_from_slice(&port.to_be_bytes());
        key.extend_from_slice(&[6, 0]);
        key
    }

    /// `struct vip_info` bytes with every hash prefix word `word`.
    fn info(word: u64, port: u16, backend_port: u16) -> Vec<u8> {
        let info = VipInfo {
            hash_prefix: [word; 4],
            addr: [10, 0, 0, 100],
            port: port.to_be_bytes(),
            backend_port: backend_port.to_be_bytes(),
            index: 0,
            pool_len: 1,
            pool: [0; crate::dataplane::xdp_layout::MAX_HASH_POOL],
            policy: 0,
            load_metric: 0,
            pad: [0; 2],
        };
        info.to_bytes()
    }

    #[test]
    fn each_vip_is_at_its_slot_and_a_taken_slot_keeps_its_first_vip() {
        let first = [10, 0, 0, 100];
        // Another port of the same address whose slot is the first's.
        let colliding = (0..=u16::MAX)
            .find(|&p| {
                p != 80 && slot_of(first, p.to_be_bytes()) == slot_of(first, 80u16.to_be_bytes())
            })
            .unwrap();
        let vips = BTreeMap::from([
            (key(first, 80), info(1, 80, 8080)),
            (key(first, 443), info(2, 443, 8443)),
            (key(first, colliding), info(3, colliding, 9000)),
        ]);
        let slots = entries(&vips);
        let at = |port: u16| {
            let slot = (slot_of(first, port.to_be_bytes()) as u32)
                .to_ne_bytes()
                .to_vec();
            slots[&slot].clone()
        };
        let expected = VipSlot {
            tag: tag_of(first, 443u16.to_be_bytes()),
            hash_prefix: [2; 4],
            port: 443u16.to_be_bytes(),
            backend_port: 8443u16.to_be_bytes(),
            ..VipSlot::default()
        };
        assert_eq!(at(443), expected.to_bytes());
        assert_eq!(slots.len(), 2, "the colliding VIP is in vips alone");
        let owner = if key(first, 80) < key(first, colliding) {
            80
        } else {
            colliding
        };
        assert_eq!(
            at(80)[..8],
            tag_of(first, owner.to_be_bytes()).to_ne_bytes()
        );
    }
}
