//! The metadata the XDP program leaves in front of each packet it hands to a socket
//! (`struct cheetah_meta` in `bpf/include/cheetah_shared.h`).

use std::mem::{offset_of, size_of};

use cheetah_core::types::Mac;

/// `struct cheetah_meta`, field for field; `shared_layout_tests` holds the two layouts
/// equal.
#[repr(C)]
pub(super) struct RawMeta {
    pub(super) magic: u32,
    pub(super) flags: u32,
    pub(super) ifindex: u32,
    pub(super) dmac: Mac,
    pub(super) smac: Mac,
}

pub const META_LEN: usize = size_of::<RawMeta>();
pub(super) const MAGIC: u32 = 0xc4ee_7a11;

pub(super) const TO_VIP: u32 = 1 << 0;
pub(super) const FROM_SERVER: u32 = 1 << 1;
pub(super) const FIB_OK: u32 = 1 << 2;
pub(super) const FIB_NO_NEIGH: u32 = 1 << 3;

impl RawMeta {
    fn read(bytes: &[u8; META_LEN]) -> Self {
        let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        let mac = |at: usize| -> Mac { bytes[at..at + 6].try_into().unwrap() };
        RawMeta {
            magic: word(offset_of!(RawMeta, magic)),
            flags: word(offset_of!(RawMeta, flags)),
            ifindex: word(offset_of!(RawMeta, ifindex)),
            dmac: mac(offset_of!(RawMeta, dmac)),
            smac: mac(offset_of!(RawMeta, smac)),
        }
    }
}

/// Where the kernel's FIB says a server reply should go next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextHop {
    /// Send out of `ifindex` with these Ethernet addresses.
    Resolved { ifindex: u32, dst: Mac, src: Mac },
    /// The route is known but the neighbour's MAC is not (yet): the kernel must resolve
    /// `gateway` on `ifindex` first.
    NoNeighbour { ifindex: u32, gateway: [u8; 4] },
    /// No route, or the FIB refused (e.g. forwarding off on `lo`, whose name the lookup
    /// gives as the incoming interface: `dataplane::host`).
    Unroutable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketMeta {
    pub to_vip: bool,
    pub from_server: bool,
    pub next_hop: NextHop,
}

impl PacketMeta {
    /// Reads the metadata from the `META_LEN` bytes in front of a packet; `None` if the
    /// XDP program could not write it (no headroom), which the magic number tells.
    pub fn parse(bytes: &[u8; META_LEN]) -> Option<Self> {
        let raw = RawMeta::read(bytes);
        if raw.magic != MAGIC {
            return None;
        }
        let next_hop = if raw.flags & FIB_OK != 0 {
            NextHop::Resolved {
                ifindex: raw.ifindex,
                dst: raw.dmac,
                src: raw.smac,
            }
        } else if raw.flags & FIB_NO_NEIGH != 0 {
            // The program leaves the gateway's address where the destination MAC goes.
            NextHop::NoNeighbour {
                ifindex: raw.ifindex,
                gateway: raw.dmac[..4].try_into().unwrap(),
            }
        } else {
            NextHop::Unroutable
        };
        Some(PacketMeta {
            to_vip: raw.flags & TO_VIP != 0,
            from_server: raw.flags & FROM_SERVER != 0,
            next_hop,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(flags: u32, ifindex: u32, macs: [u8; 12]) -> [u8; META_LEN] {
        let mut bytes = [0u8; META_LEN];
        let mut put = |at: usize, field: &[u8]| bytes[at..at + field.len()].copy_from_slice(field);
        put(offset_of!(RawMeta, magic), &MAGIC.to_ne_bytes());
        put(offset_of!(RawMeta, flags), &flags.to_ne_bytes());
        put(offset_of!(RawMeta, ifindex), &ifindex.to_ne_bytes());
        put(offset_of!(RawMeta, dmac), &macs[..6]);
        put(offset_of!(RawMeta, smac), &macs[6..]);
        bytes
    }

    #[test]
    fn resolved_next_hop_carries_both_macs() {
        let macs = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let parsed = PacketMeta::parse(&meta(FROM_SERVER | FIB_OK, 7, macs)).unwrap();
        assert!(parsed.from_server && !parsed.to_vip);
        assert_eq!(
            parsed.next_hop,
            NextHop::Resolved {
                ifindex: 7,
                dst: [1, 2, 3, 4, 5, 6],
                src: [7, 8, 9, 10, 11, 12]
            }
        );
    }

    #[test]
    fn missing_neighbour_names_the_gateway() {
        let macs = [10, 10, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        let parsed = PacketMeta::parse(&meta(FROM_SERVER | FIB_NO_NEIGH, 3, macs)).unwrap();
        assert_eq!(
            parsed.next_hop,
            NextHop::NoNeighbour {
                ifindex: 3,
                gateway: [10, 10, 1, 1]
            }
        );
    }

    #[test]
    fn headroom_garbage_is_not_metadata() {
        assert_eq!(PacketMeta::parse(&[0xab; META_LEN]), None);
        let parsed = PacketMeta::parse(&meta(TO_VIP, 0, [0; 12])).unwrap();
        assert!(parsed.to_vip);
        assert_eq!(parsed.next_hop, NextHop::Unroutable);
    }
}
