//! Small vocabulary types shared by every stage.

use std::fmt;

/// Monotonic time in nanoseconds, always passed in by the caller.
pub type Nanos = u64;

pub const NANOS_PER_MS: Nanos = 1_000_000;
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// Identifier of a server in the AllServers table.
///
/// The stateless cookie has at most 14 bits for it (16 - k, k >= 2 epoch bits), so ids
/// live in `0..=ServerId::MAX`; the configured [`CookieLayout`](crate::cookie::CookieLayout)
/// may allow fewer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ServerId(pub u16);

impl ServerId {
    pub const MAX: u16 = 0x3fff;
    /// Number of distinct ids a cookie can name.
    pub const SPACE: usize = Self::MAX as usize + 1;

    pub fn new(id: u16) -> Option<Self> {
        (id <= Self::MAX).then_some(ServerId(id))
    }

    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One entry per server id (or `N` entries), on the heap from the start: a table over
/// the id space is too large to be built on a thread's stack. Tables the packet paths
/// index by id have this type, not a slice, so that an id already known to be below
/// [`ServerId::SPACE`] (a cookie's id bits, or an earlier lookup) is not checked again.
pub fn boxed_array<T: Clone, const N: usize>(value: T) -> Box<[T; N]> {
    vec![value; N]
        .into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| unreachable!("N entries were made"))
}

impl fmt::Debug for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server#{}", self.0)
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A MAC address in wire order.
pub type Mac = [u8; 6];

pub fn format_mac(mac: &Mac) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
    )
}

pub fn parse_mac(text: &str) -> Option<Mac> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in mac.iter_mut() {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_text_round_trips() {
        let mac = parse_mac("02:00:0a:ff:01:9c").unwrap();
        assert_eq!(mac, [2, 0, 0x0a, 0xff, 1, 0x9c]);
        assert_eq!(format_mac(&mac), "02:00:0a:ff:01:9c");
    }

    #[test]
    fn malformed_mac_text_is_refused() {
        for bad in [
            "",
            "02:00:0a:ff:01",
            "02:00:0a:ff:01:9c:00",
            "2:00:0a:ff:01:9c",
            "zz:00:0a:ff:01:9c",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn server_ids_fit_fifteen_bits() {
        assert!(ServerId::new(0x3fff).is_some());
        assert!(ServerId::new(0x4000).is_none());
    }
}
