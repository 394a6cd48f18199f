//! IPv4 headers, options included.

use std::net::Ipv4Addr;

use super::{checksum, read_u16, read_u32, write_u16, write_u32};
use crate::verdict::DropReason;

pub const MIN_HEADER_LEN: usize = 20;

/// Byte offsets of the header's fields, for code that reads a header it has already
/// checked without going through a view.
pub mod field {
    pub const VER_IHL: usize = 0;
    pub const TOTAL_LEN: usize = 2;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

const MORE_FRAGMENTS: u16 = 0x2000;
const FRAGMENT_OFFSET: u16 = 0x1fff;

/// A view of an IPv4 packet starting at its header. The buffer may extend past the total
/// length (Ethernet padding); [`payload`](Self::payload) stops at the total length.
#[derive(Debug)]
pub struct Ipv4Packet<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub fn new_checked(buffer: T) -> Result<Self, DropReason> {
        let bytes = buffer.as_ref();
        if bytes.len() < MIN_HEADER_LEN {
            return Err(DropReason::TruncatedIpv4);
        }
        if bytes[field::VER_IHL] >> 4 != 4 {
            return Err(DropReason::BadIpVersion);
        }
        let header_len = ((bytes[field::VER_IHL] & 0x0f) as usize) * 4;
        if header_len < MIN_HEADER_LEN || header_len > bytes.len() {
            return Err(DropReason::BadIpv4HeaderLength);
        }
        let total_len = read_u16(bytes, field::TOTAL_LEN) as usize;
        if total_len < header_len || total_len > bytes.len() {
            return Err(DropReason::BadIpv4TotalLength);
        }
        Ok(Ipv4Packet { buffer })
    }

    /// Wraps a buffer the caller has already checked with [`new_checked`](Self::new_checked).
    #[inline]
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    #[inline]
    pub fn total_len(&self) -> usize {
        read_u16(self.buffer.as_ref(), field::TOTAL_LEN) as usize
    }

    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    #[inline]
    pub fn src(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SRC)
    }

    #[inline]
    pub fn dst(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DST)
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.src())
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.dst())
    }

    #[inline]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// True for any fragment: more-fragments set or a non-zero offset.
    #[inline]
    pub fn is_fragment(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & (MORE_FRAGMENTS | FRAGMENT_OFFSET) != 0
    }

    /// The L4 bytes, from the end of the header to the total length.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len()]
    }

    pub fn header_checksum_is_valid(&self) -> bool {
        checksum::fold(checksum::sum(&self.buffer.as_ref()[..self.header_len()])) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.header_len(), self.total_len());
        &mut self.buffer.as_mut()[start..end]
    }

    /// Rewrites the source address, updating the header checksum. Returns the old value so
    /// the caller can update the L4 pseudo-header checksum with it.
    #[inline]
    pub fn set_src(&mut self, addr: u32) -> u32 {
        self.set_addr(field::SRC, addr)
    }

    #[inline]
    pub fn set_dst(&mut self, addr: u32) -> u32 {
        self.set_addr(field::DST, addr)
    }

    #[inline]
    fn set_addr(&mut self, at: usize, addr: u32) -> u32 {
        let buf = self.buffer.as_mut();
        let old = read_u32(buf, at);
        write_u32(buf, at, addr);
        let sum = checksum::update_u32(read_u16(buf, field::CHECKSUM), old, addr);
        write_u16(buf, field::CHECKSUM, sum);
        old
    }

    /// Recomputes the header checksum from scratch (packet builders only).
    pub fn fill_checksum(&mut self) {
        let len = self.header_len();
        let buf = self.buffer.as_mut();
        write_u16(buf, field::CHECKSUM, 0);
        let sum = checksum::compute(&buf[..len]);
        write_u16(buf, field::CHECKSUM, sum);
    }
}

/// Writes a 20-byte IPv4 header with a correct checksum (packet builders only).
pub fn write_header(buf: &mut [u8], src: u32, dst: u32, protocol: u8, total_len: u16, ttl: u8) {
    buf[field::VER_IHL] = 0x45;
    buf[1] = 0;
    write_u16(buf, field::TOTAL_LEN, total_len);
    write_u16(buf, 4, 0x1234);
    write_u16(buf, field::FLAGS_FRAG, 0x4000); // don't fragment
    buf[field::TTL] = ttl;
    buf[field::PROTOCOL] = protocol;
    write_u32(buf, field::SRC, src);
    write_u32(buf, field::DST, dst);
    Ipv4Packet::new_checked(&mut buf[..])
        .expect("builder writes a valid header")
        .fill_checksum();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(total_len: u16) -> Vec<u8> {
        let mut buf = vec![0u8; total_len as usize];
        write_header(&mut buf, 0x0a000001, 0x0a000002, 6, total_len, 64);
        buf
    }

    #[test]
    fn valid_header_parses_and_verifies() {
        let p = Ipv4Packet::new_checked(packet(40)).unwrap();
        assert_eq!((p.header_len(), p.total_len(), p.protocol()), (20, 40, 6));
        assert_eq!(p.src_addr(), Ipv4Addr::new(10, 0, 0, 1));
        assert!(p.header_checksum_is_valid());
        assert!(!p.is_fragment());
        assert_eq!(p.payload().len(), 20);
    }

    #[test]
    fn ethernet_padding_is_not_payload() {
        let mut buf = packet(40);
        buf.extend_from_slice(&[0xee; 6]);
        assert_eq!(Ipv4Packet::new_checked(buf).unwrap().payload().len(), 20);
    }

    #[test]
    fn options_extend_the_header() {
        let mut buf = packet(44);
        buf[0] = 0x46;
        let p = Ipv4Packet::new_checked(buf).unwrap();
        assert_eq!((p.header_len(), p.payload().len()), (24, 20));
    }

    #[test]
    fn malformed_headers_get_typed_reasons() {
        assert_eq!(
            Ipv4Packet::new_checked(vec![0x45; 19]).unwrap_err(),
            DropReason::TruncatedIpv4
        );
        let mut v6 = packet(40);
        v6[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(v6).unwrap_err(),
            DropReason::BadIpVersion
        );
        let mut short_ihl = packet(40);
        short_ihl[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(short_ihl).unwrap_err(),
            DropReason::BadIpv4HeaderLength
        );
        let mut long_ihl = packet(40);
        long_ihl[0] = 0x4f;
        assert_eq!(
            Ipv4Packet::new_checked(long_ihl).unwrap_err(),
            DropReason::BadIpv4HeaderLength
        );
        let mut long_total = packet(40);
        long_total[3] = 41;
        assert_eq!(
            Ipv4Packet::new_checked(long_total).unwrap_err(),
            DropReason::BadIpv4TotalLength
        );
        let mut short_total = packet(40);
        short_total[3] = 19;
        assert_eq!(
            Ipv4Packet::new_checked(short_total).unwrap_err(),
            DropReason::BadIpv4TotalLength
        );
    }

    #[test]
    fn fragments_are_recognised() {
        let mut mf = packet(40);
        mf[6] = 0x20;
        assert!(Ipv4Packet::new_checked(mf).unwrap().is_fragment());
        let mut offset = packet(40);
        offset[6] = 0x00;
        offset[7] = 0x10;
        assert!(Ipv4Packet::new_checked(offset).unwrap().is_fragment());
    }

    #[test]
    fn address_rewrite_keeps_header_checksum_valid() {
        let mut p = Ipv4Packet::new_checked(packet(40)).unwrap();
        let old = p.set_dst(0xc0a80a0b);
        assert_eq!(old, 0x0a000002);
        assert_eq!(p.dst(), 0xc0a80a0b);
        assert!(p.header_checksum_is_valid());
    }
}
