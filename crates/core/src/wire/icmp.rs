//! ICMPv4 messages, and the packet embedded in an error message.

use super::{checksum, read_u16, write_u16};
use crate::verdict::DropReason;

pub const HEADER_LEN: usize = 8;

/// Byte offsets of the header's fields, for code that reads a header it has already
/// checked without going through a view.
pub mod field {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
}

pub mod message {
    pub const ECHO_REPLY: u8 = 0;
    pub const DESTINATION_UNREACHABLE: u8 = 3;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    pub const PARAMETER_PROBLEM: u8 = 12;
}

#[derive(Debug)]
pub struct Icmpv4Packet<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    pub fn new_checked(buffer: T) -> Result<Self, DropReason> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(DropReason::TruncatedIcmp);
        }
        Ok(Icmpv4Packet { buffer })
    }

    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Errors carry the offending packet's IP header and the start of its payload.
    pub fn is_error(&self) -> bool {
        matches!(
            self.msg_type(),
            message::DESTINATION_UNREACHABLE | message::TIME_EXCEEDED | message::PARAMETER_PROBLEM
        )
    }

    /// The embedded packet of an error message (IP header onward).
    pub fn embedded(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    pub fn embedded_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }

    /// Updates the ICMP checksum for bytes of the message that changed from `old` to `new`
    /// at `offset` from the start of the ICMP header.
    pub fn update_checksum(&mut self, offset: usize, old: &[u8], new: &[u8]) {
        let buf = self.buffer.as_mut();
        let sum = checksum::update(read_u16(buf, field::CHECKSUM), offset % 2 == 1, old, new);
        write_u16(buf, field::CHECKSUM, sum);
    }

    /// Recomputes the checksum over the whole message (packet builders only).
    pub fn fill_checksum(&mut self) {
        let buf = self.buffer.as_mut();
        write_u16(buf, field::CHECKSUM, 0);
        let sum = checksum::compute(buf);
        write_u16(buf, field::CHECKSUM, sum);
    }
}

pub fn checksum_is_valid(message: &[u8]) -> bool {
    checksum::fold(checksum::sum(message)) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_types_expose_the_embedded_packet() {
        let mut buf = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc, 0x45, 0, 0, 0];
        let mut p = Icmpv4Packet::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum();
        assert!(p.is_error());
        assert_eq!(p.embedded(), &[0x45, 0, 0, 0]);
        p.embedded_mut()[1] = 0x10;
        p.update_checksum(9, &[0], &[0x10]);
        assert!(checksum_is_valid(&buf));
    }

    #[test]
    fn echo_is_not_an_error_and_short_messages_are_refused() {
        assert!(!Icmpv4Packet::new_checked(&[8u8, 0, 0, 0, 0, 0, 0, 0][..])
            .unwrap()
            .is_error());
        assert_eq!(
            Icmpv4Packet::new_checked(&[3u8; 7][..]).unwrap_err(),
            DropReason::TruncatedIcmp
        );
    }
}
