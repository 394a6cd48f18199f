//! Ethernet II frames with up to two 802.1Q / 802.1ad tags.

use super::{read_u16, write_u16};
use crate::types::Mac;
use crate::verdict::DropReason;

pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const VLAN: u16 = 0x8100;
    pub const QINQ: u16 = 0x88a8;
    pub const IPV6: u16 = 0x86dd;
}

/// An untagged header.
pub const HEADER_LEN: usize = 14;
/// One 802.1Q or 802.1ad tag: TPID and TCI.
pub const TAG_LEN: usize = 4;
/// The most tags a frame is read past (an outer 802.1ad and an inner 802.1Q).
pub const MAX_TAGS: usize = 2;

/// Byte offsets of the header's fields, for code that reads a header it has already
/// checked without going through a view.
pub mod field {
    pub const DST: std::ops::Range<usize> = 0..6;
    pub const SRC: std::ops::Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
}

/// Whether `ethertype` is a VLAN tag's (802.1Q or 802.1ad), which a reader steps past.
#[inline]
pub fn is_tag(ethertype: u16) -> bool {
    ethertype == ethertype::VLAN || ethertype == ethertype::QINQ
}

/// A view of an Ethernet frame; the EtherType is the one after any VLAN tags.
#[derive(Debug)]
pub struct EthernetFrame<T> {
    buffer: T,
    payload_offset: usize,
    ethertype: u16,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub fn new_checked(buffer: T) -> Result<Self, DropReason> {
        let bytes = buffer.as_ref();
        if bytes.len() < HEADER_LEN {
            return Err(DropReason::TruncatedEthernet);
        }
        let mut offset = field::ETHERTYPE;
        let mut ethertype = read_u16(bytes, offset);
        let mut tags = 0;
        while is_tag(ethertype) && tags < MAX_TAGS {
            offset += TAG_LEN;
            if bytes.len() < offset + 2 {
                return Err(DropReason::TruncatedEthernet);
            }
            ethertype = read_u16(bytes, offset);
            tags += 1;
        }
        Ok(EthernetFrame {
            buffer,
            payload_offset: offset + 2,
            ethertype,
        })
    }

    #[inline]
    pub fn ethertype(&self) -> u16 {
        self.ethertype
    }

    /// Offset of the L3 header from the start of the frame.
    #[inline]
    pub fn payload_offset(&self) -> usize {
        self.payload_offset
    }

    #[inline]
    pub fn dst_mac(&self) -> Mac {
        self.buffer.as_ref()[field::DST].try_into().unwrap()
    }

    #[inline]
    pub fn src_mac(&self) -> Mac {
        self.buffer.as_ref()[field::SRC].try_into().unwrap()
    }

    /// VLAN id of the outermost tag, if any.
    pub fn vlan_id(&self) -> Option<u16> {
        (self.payload_offset > HEADER_LEN).then(|| read_u16(self.buffer.as_ref(), 14) & 0x0fff)
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    #[inline]
    pub fn set_dst_mac(&mut self, mac: &Mac) {
        self.buffer.as_mut()[field::DST].copy_from_slice(mac);
    }

    #[inline]
    pub fn set_src_mac(&mut self, mac: &Mac) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(mac);
    }
}

/// Writes an untagged Ethernet header (used by test packet builders).
pub fn write_header(buf: &mut [u8], dst: &Mac, src: &Mac, ethertype: u16) {
    buf[field::DST].copy_from_slice(dst);
    buf[field::SRC].copy_from_slice(src);
    write_u16(buf, field::ETHERTYPE, ethertype);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ethertypes: &[u16]) -> Vec<u8> {
        let mut buf = vec![0u8; 12];
        buf[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        buf[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        for (i, t) in ethertypes.iter().enumerate() {
            buf.extend_from_slice(&t.to_be_bytes());
            if i + 1 < ethertypes.len() {
                buf.extend_from_slice(&[0x00, 0x2a]); // TCI: VLAN 42
            }
        }
        buf.extend_from_slice(&[0x45; 20]);
        buf
    }

    #[test]
    fn untagged_frame_payload_follows_header() {
        let f = EthernetFrame::new_checked(frame(&[ethertype::IPV4])).unwrap();
        assert_eq!(f.ethertype(), ethertype::IPV4);
        assert_eq!(f.payload_offset(), 14);
        assert_eq!(f.vlan_id(), None);
        assert_eq!(f.src_mac(), [2, 0, 0, 0, 0, 2]);
    }

    #[test]
    fn vlan_and_qinq_tags_are_skipped() {
        let f = EthernetFrame::new_checked(frame(&[ethertype::VLAN, ethertype::IPV4])).unwrap();
        assert_eq!(
            (f.ethertype(), f.payload_offset(), f.vlan_id()),
            (ethertype::IPV4, 18, Some(42))
        );
        let f =
            EthernetFrame::new_checked(frame(&[ethertype::QINQ, ethertype::VLAN, ethertype::IPV6]))
                .unwrap();
        assert_eq!((f.ethertype(), f.payload_offset()), (ethertype::IPV6, 22));
    }

    #[test]
    fn truncated_frames_are_refused() {
        for len in 0..14 {
            assert_eq!(
                EthernetFrame::new_checked(vec![0u8; len]).unwrap_err(),
                DropReason::TruncatedEthernet
            );
        }
        let mut tagged = frame(&[ethertype::VLAN, ethertype::IPV4]);
        tagged.truncate(17);
        assert_eq!(
            EthernetFrame::new_checked(tagged).unwrap_err(),
            DropReason::TruncatedEthernet
        );
    }

    #[test]
    fn mac_setters_rewrite_in_place() {
        let mut f = EthernetFrame::new_checked(frame(&[ethertype::IPV4])).unwrap();
        f.set_dst_mac(&[9; 6]);
        f.set_src_mac(&[8; 6]);
        let buf = f.into_inner();
        assert_eq!(&buf[0..12], &[9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8]);
    }
}
