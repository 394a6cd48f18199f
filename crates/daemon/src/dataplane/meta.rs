//! The metadata the XDP program leaves in front of each packet it hands to a socket
//! (layout shared with `struct cheetah_meta` in `bpf/xdp_lb.c`).

use cheetah_core::types::Mac;

pub const META_LEN: usize = 24;
const MAGIC: u32 = 0xc4ee_7a11;

const TO_VIP: u32 = 1 << 0;
const FROM_SERVER: u32 = 1 << 1;
const FIB_OK: u32 = 1 << 2;
const FIB_NO_NEIGH: u32 = 1 << 3;

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
        let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        if word(0) != MAGIC {
            return None;
        }
        let flags = word(4);
        let ifindex = word(8);
        let next_hop = if flags & FIB_OK != 0 {
            NextHop::Resolved {
                ifindex,
                dst: bytes[12..18].try_into().unwrap(),
                src: bytes[18..24].try_into().unwrap(),
            }
        } else if flags & FIB_NO_NEIGH != 0 {
            NextHop::NoNeighbour {
                ifindex,
                gateway: bytes[12..16].try_into().unwrap(),
            }
        } else {
            NextHop::Unroutable
        };
        Some(PacketMeta {
            to_vip: flags & TO_VIP != 0,
            from_server: flags & FROM_SERVER != 0,
            next_hop,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(flags: u32, ifindex: u32, macs: [u8; 12]) -> [u8; META_LEN] {
        let mut bytes = [0u8; META_LEN];
        bytes[0..4].copy_from_slice(&MAGIC.to_ne_bytes());
        bytes[4..8].copy_from_slice(&flags.to_ne_bytes());
        bytes[8..12].copy_from_slice(&ifindex.to_ne_bytes());
        bytes[12..24].copy_from_slice(&macs);
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
