//! Zero-copy packet views.
//!
//! Each view wraps a buffer, checks its length and header fields once in `new_checked`
//! (returning the typed [`DropReason`](crate::verdict::DropReason) a malformed packet is
//! counted under), and after that every accessor is a cheap read at a fixed offset.
//! Setters that change a covered field update the checksum incrementally through
//! [`checksum::update`].

pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod tcp;
pub mod tcp_options;
pub mod udp;

pub use ethernet::EthernetFrame;
pub use icmp::Icmpv4Packet;
pub use ipv4::Ipv4Packet;
pub use ipv6::Ipv6Packet;
pub use tcp::TcpSegment;
pub use udp::UdpDatagram;

/// IP protocol numbers cheetah looks at.
pub mod ip_proto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ICMPV6: u8 = 58;
}

// One bounds check and one load per field.

#[inline(always)]
pub(crate) fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(buf[at..at + 2].try_into().unwrap())
}

#[inline(always)]
pub(crate) fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(buf[at..at + 4].try_into().unwrap())
}

#[inline(always)]
pub(crate) fn write_u16(buf: &mut [u8], at: usize, value: u16) {
    buf[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

#[inline(always)]
pub(crate) fn write_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_be_bytes());
}
