//! IPv6 headers with their extension-header chain walked to the upper-layer protocol.
//!
//! cheetah does not balance IPv6 yet; it parses far enough to classify (and count) the
//! traffic and to hand everything that is not for a VIP to the host untouched.

use std::net::Ipv6Addr;

use super::read_u16;
use crate::verdict::DropReason;

pub const HEADER_LEN: usize = 40;
/// More extension headers than this is not a real packet; stop walking.
const MAX_EXTENSION_HEADERS: usize = 8;

mod next_header {
    pub const HOP_BY_HOP: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const AUTHENTICATION: u8 = 51;
    pub const DESTINATION_OPTIONS: u8 = 60;
}

#[derive(Debug)]
pub struct Ipv6Packet<T> {
    buffer: T,
    upper_protocol: u8,
    upper_offset: usize,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub fn new_checked(buffer: T) -> Result<Self, DropReason> {
        let bytes = buffer.as_ref();
        if bytes.len() < HEADER_LEN {
            return Err(DropReason::TruncatedIpv6);
        }
        if bytes[0] >> 4 != 6 {
            return Err(DropReason::BadIpVersion);
        }
        let end = HEADER_LEN + read_u16(bytes, 4) as usize;
        if end > bytes.len() {
            return Err(DropReason::BadIpv6PayloadLength);
        }
        let mut protocol = bytes[6];
        let mut offset = HEADER_LEN;
        for _ in 0..=MAX_EXTENSION_HEADERS {
            let len = match protocol {
                next_header::HOP_BY_HOP
                | next_header::ROUTING
                | next_header::DESTINATION_OPTIONS => {
                    bytes.get(offset + 1).map(|&l| (l as usize + 1) * 8)
                }
                next_header::FRAGMENT => Some(8),
                next_header::AUTHENTICATION => bytes.get(offset + 1).map(|&l| (l as usize + 2) * 4),
                _ => {
                    return Ok(Ipv6Packet {
                        buffer,
                        upper_protocol: protocol,
                        upper_offset: offset,
                    })
                }
            };
            match len {
                Some(len) if offset + len <= end => {
                    protocol = bytes[offset];
                    offset += len;
                }
                _ => return Err(DropReason::BadIpv6ExtensionHeader),
            }
        }
        Err(DropReason::BadIpv6ExtensionHeader)
    }

    /// The protocol after the extension headers (TCP, UDP, ICMPv6, ESP, no-next-header...).
    #[inline]
    pub fn upper_protocol(&self) -> u8 {
        self.upper_protocol
    }

    /// Offset of the upper-layer header from the start of the IPv6 header.
    #[inline]
    pub fn upper_offset(&self) -> usize {
        self.upper_offset
    }

    pub fn src_addr(&self) -> Ipv6Addr {
        let b: [u8; 16] = self.buffer.as_ref()[8..24].try_into().unwrap();
        Ipv6Addr::from(b)
    }

    pub fn dst_addr(&self) -> Ipv6Addr {
        let b: [u8; 16] = self.buffer.as_ref()[24..40].try_into().unwrap();
        Ipv6Addr::from(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(next: u8, extensions: &[(u8, Vec<u8>)], upper_len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; HEADER_LEN];
        buf[0] = 0x60;
        buf[6] = extensions.first().map_or(next, |e| e.0);
        for (i, (_, body)) in extensions.iter().enumerate() {
            let mut ext = body.clone();
            ext[0] = extensions.get(i + 1).map_or(next, |e| e.0);
            buf.extend_from_slice(&ext);
        }
        buf.extend(std::iter::repeat_n(0, upper_len));
        let payload = (buf.len() - HEADER_LEN) as u16;
        buf[4..6].copy_from_slice(&payload.to_be_bytes());
        buf[24..40].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        buf
    }

    #[test]
    fn plain_header_leads_to_upper_protocol() {
        let p = Ipv6Packet::new_checked(packet(6, &[], 20)).unwrap();
        assert_eq!((p.upper_protocol(), p.upper_offset()), (6, 40));
        assert_eq!(p.dst_addr(), Ipv6Addr::LOCALHOST);
    }

    #[test]
    fn extension_headers_are_walked() {
        let hop = (0u8, vec![0u8; 8]);
        let dest = (60u8, {
            let mut v = vec![0u8; 16];
            v[1] = 1;
            v
        });
        let frag = (44u8, vec![0u8; 8]);
        let p = Ipv6Packet::new_checked(packet(17, &[hop, dest, frag], 8)).unwrap();
        assert_eq!(
            (p.upper_protocol(), p.upper_offset()),
            (17, 40 + 8 + 16 + 8)
        );
    }

    #[test]
    fn malformed_packets_get_typed_reasons() {
        assert_eq!(
            Ipv6Packet::new_checked(vec![0x60; 39]).unwrap_err(),
            DropReason::TruncatedIpv6
        );
        let mut long = packet(6, &[], 20);
        long[5] = 200;
        assert_eq!(
            Ipv6Packet::new_checked(long).unwrap_err(),
            DropReason::BadIpv6PayloadLength
        );
        let mut overrun = packet(6, &[(0u8, vec![0u8; 8])], 0);
        overrun[41] = 5; // claims 48 bytes of hop-by-hop options
        assert_eq!(
            Ipv6Packet::new_checked(overrun).unwrap_err(),
            DropReason::BadIpv6ExtensionHeader
        );
        let many: Vec<_> = (0..12).map(|_| (60u8, vec![0u8; 8])).collect();
        assert_eq!(
            Ipv6Packet::new_checked(packet(6, &many, 0)).unwrap_err(),
            DropReason::BadIpv6ExtensionHeader
        );
    }
}
