//! UDP datagrams (classified and counted; not balanced yet).

use super::read_u16;
use crate::verdict::DropReason;

pub const HEADER_LEN: usize = 8;

#[derive(Debug)]
pub struct UdpDatagram<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpDatagram<T> {
    pub fn new_checked(buffer: T) -> Result<Self, DropReason> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(DropReason::TruncatedUdp);
        }
        Ok(UdpDatagram { buffer })
    }

    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 0)
    }

    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 2)
    }

    pub fn length(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_and_truncation() {
        let d = UdpDatagram::new_checked(&[0x30, 0x39, 0x00, 0x35, 0x00, 0x08, 0, 0][..]).unwrap();
        assert_eq!((d.src_port(), d.dst_port(), d.length()), (12345, 53, 8));
        assert_eq!(
            UdpDatagram::new_checked(&[0u8; 7][..]).unwrap_err(),
            DropReason::TruncatedUdp
        );
    }
}
