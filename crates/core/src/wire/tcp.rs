//! TCP segments: header fields, flags, and in-place rewrites with checksum updates.

use super::{checksum, read_u16, read_u32, write_u16, write_u32};
use crate::verdict::DropReason;

pub const MIN_HEADER_LEN: usize = 20;

/// Byte offsets of the header's fields, for code that reads a header it has already
/// checked without going through a view.
pub mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ: usize = 4;
    pub const ACK: usize = 8;
    pub const DATA_OFFSET: usize = 12;
    pub const FLAGS: usize = 13;
    pub const CHECKSUM: usize = 16;
}

pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}

/// A view of a TCP segment from its header to the end of the IP payload.
#[derive(Debug)]
pub struct TcpSegment<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpSegment<T> {
    pub fn new_checked(buffer: T) -> Result<Self, DropReason> {
        let bytes = buffer.as_ref();
        if bytes.len() < MIN_HEADER_LEN {
            return Err(DropReason::TruncatedTcp);
        }
        let header_len = ((bytes[field::DATA_OFFSET] >> 4) as usize) * 4;
        if header_len < MIN_HEADER_LEN || header_len > bytes.len() {
            return Err(DropReason::BadTcpDataOffset);
        }
        Ok(TcpSegment { buffer })
    }

    /// Wraps a buffer the caller has already checked with [`new_checked`](Self::new_checked).
    #[inline]
    pub fn new_unchecked(buffer: T) -> Self {
        TcpSegment { buffer }
    }

    #[inline]
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    #[inline]
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    #[inline]
    pub fn seq(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SEQ)
    }

    #[inline]
    pub fn ack(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::ACK)
    }

    #[inline]
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::DATA_OFFSET] >> 4) as usize) * 4
    }

    #[inline]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The option bytes between the fixed header and the data.
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }

    #[inline]
    pub fn segment_len(&self) -> usize {
        self.buffer.as_ref().len()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpSegment<T> {
    /// Overwrites a 32-bit word of the options area (a TSval or TSecr) at `option_offset`
    /// bytes into the options, keeping the checksum exactly as right or wrong as it was.
    #[inline]
    pub fn rewrite_option_u32(&mut self, option_offset: usize, value: u32) {
        let at = MIN_HEADER_LEN + option_offset;
        let buf = self.buffer.as_mut();
        let old = read_u32(buf, at);
        if old == value {
            // Leave even a 0xffff checksum byte-identical (eqn. 3 would turn it into 0).
            return;
        }
        write_u32(buf, at, value);
        let sum = checksum::update_u32_at(read_u16(buf, field::CHECKSUM), at % 2 == 1, old, value);
        write_u16(buf, field::CHECKSUM, sum);
    }

    /// Folds a change of a pseudo-header address (NAT) into the checksum.
    #[inline]
    pub fn update_checksum_for_address(&mut self, old: u32, new: u32) {
        let buf = self.buffer.as_mut();
        let sum = checksum::update_u32(read_u16(buf, field::CHECKSUM), old, new);
        write_u16(buf, field::CHECKSUM, sum);
    }

    #[inline]
    pub fn set_src_port(&mut self, port: u16) {
        self.set_port(field::SRC_PORT, port)
    }

    #[inline]
    pub fn set_dst_port(&mut self, port: u16) {
        self.set_port(field::DST_PORT, port)
    }

    #[inline]
    fn set_port(&mut self, at: usize, port: u16) {
        let buf = self.buffer.as_mut();
        let old = read_u16(buf, at);
        write_u16(buf, at, port);
        let sum = checksum::update_u16(read_u16(buf, field::CHECKSUM), old, port);
        write_u16(buf, field::CHECKSUM, sum);
    }
}

/// Fields of a TCP header for packet builders.
#[derive(Clone, Debug)]
pub struct TcpHeader<'a> {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    /// Raw option bytes, padded by the caller to a multiple of 4.
    pub options: &'a [u8],
}

impl TcpHeader<'_> {
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.len()
    }

    /// Writes the header (checksum over the pseudo header and `payload` included).
    pub fn write(&self, buf: &mut [u8], src_ip: u32, dst_ip: u32, payload: &[u8]) {
        assert_eq!(
            self.options.len() % 4,
            0,
            "TCP options must be padded to 32 bits"
        );
        let hl = self.header_len();
        write_u16(buf, field::SRC_PORT, self.src_port);
        write_u16(buf, field::DST_PORT, self.dst_port);
        write_u32(buf, field::SEQ, self.seq);
        write_u32(buf, field::ACK, self.ack);
        buf[field::DATA_OFFSET] = ((hl / 4) as u8) << 4;
        buf[field::FLAGS] = self.flags;
        write_u16(buf, 14, self.window);
        write_u16(buf, field::CHECKSUM, 0);
        write_u16(buf, 18, 0);
        buf[MIN_HEADER_LEN..hl].copy_from_slice(self.options);
        buf[hl..hl + payload.len()].copy_from_slice(payload);
        let sum = pseudo_header_sum(src_ip, dst_ip, super::ip_proto::TCP, hl + payload.len())
            + checksum::sum(&buf[..hl + payload.len()]);
        write_u16(buf, field::CHECKSUM, checksum::finish(sum));
    }
}

/// Ones'-complement sum of the IPv4 pseudo header.
pub fn pseudo_header_sum(src: u32, dst: u32, protocol: u8, l4_len: usize) -> u32 {
    (src >> 16) + (src & 0xffff) + (dst >> 16) + (dst & 0xffff) + protocol as u32 + l4_len as u32
}

/// True if the segment's checksum verifies against the IPv4 pseudo header (tests only:
/// the data path never verifies L4 checksums).
pub fn checksum_is_valid(segment: &[u8], src: u32, dst: u32) -> bool {
    let sum =
        pseudo_header_sum(src, dst, super::ip_proto::TCP, segment.len()) + checksum::sum(segment);
    checksum::fold(sum) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: u32 = 0x0a000001;
    const DST: u32 = 0x0a000002;

    fn segment(options: &[u8], payload: &[u8]) -> Vec<u8> {
        let header = TcpHeader {
            src_port: 40000,
            dst_port: 80,
            seq: 1,
            ack: 2,
            flags: flags::ACK,
            window: 512,
            options,
        };
        let mut buf = vec![0u8; header.header_len() + payload.len()];
        header.write(&mut buf, SRC, DST, payload);
        buf
    }

    #[test]
    fn built_segment_parses_and_verifies() {
        let buf = segment(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2], b"GET /");
        assert!(checksum_is_valid(&buf, SRC, DST));
        let s = TcpSegment::new_checked(&buf[..]).unwrap();
        assert_eq!(
            (
                s.src_port(),
                s.dst_port(),
                s.header_len(),
                s.options().len()
            ),
            (40000, 80, 32, 12)
        );
        assert_eq!(s.flags(), flags::ACK);
    }

    #[test]
    fn malformed_headers_get_typed_reasons() {
        assert_eq!(
            TcpSegment::new_checked(&[0u8; 19][..]).unwrap_err(),
            DropReason::TruncatedTcp
        );
        let mut small = segment(&[], b"");
        small[12] = 0x40;
        assert_eq!(
            TcpSegment::new_checked(&small[..]).unwrap_err(),
            DropReason::BadTcpDataOffset
        );
        let mut past = segment(&[], b"");
        past[12] = 0x60;
        assert_eq!(
            TcpSegment::new_checked(&past[..]).unwrap_err(),
            DropReason::BadTcpDataOffset
        );
    }

    #[test]
    fn option_rewrite_at_odd_offset_keeps_checksum_valid() {
        // MSS(4) + WS(3) + TS(10) + EOL pad: TSval sits at option offset 9, an odd offset.
        let opts = [
            2, 4, 5, 0xb4, 3, 3, 7, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
        ];
        let mut buf = segment(&opts, b"x");
        let mut s = TcpSegment::new_checked(&mut buf[..]).unwrap();
        s.rewrite_option_u32(9, 0xdeadbeef);
        s.rewrite_option_u32(13, 0x01020304);
        assert!(checksum_is_valid(&buf, SRC, DST));
        assert_eq!(&buf[29..33], &0xdeadbeefu32.to_be_bytes());
    }

    #[test]
    fn port_and_address_rewrites_keep_checksum_valid() {
        let mut buf = segment(&[], b"hello");
        let mut s = TcpSegment::new_checked(&mut buf[..]).unwrap();
        s.set_dst_port(8080);
        s.update_checksum_for_address(DST, 0xc0a80001);
        assert!(checksum_is_valid(&buf, SRC, 0xc0a80001));
    }
}
