//! The stateless TCP-timestamp cookie (paper section 3.1 and appendix C).
//!
//! ```text
//!  TSval toward the client:  | v | (server id XOR h) : 15 | server's low 16 bits |
//!  TSecr from the client:      same 16 MSB echoed back  | low 16 bits          |
//! ```
//! `v` is the parity of the server's own MSB that the cookie displaced (see
//! [`super::msb`]); `h` is 15 bits of the keyed hash of the connection id, so the cookie
//! looks random to a client and reveals neither the id nor the key.

use crate::types::ServerId;

const ID_BITS: u16 = 0x7fff;
const VERSION_BIT: u16 = 0x8000;

/// The 15 hash bits a connection's cookie is masked with. Taken from the upper half of the
/// 64-bit hash so they are independent of `h % n` used by hash-based policies.
#[inline]
pub fn mask(flow_hash: u64) -> u16 {
    (flow_hash >> 32) as u16 & ID_BITS
}

/// The 16-bit cookie for `server`, carrying the parity of the server's original MSB.
#[inline]
pub fn encode(server: ServerId, flow_hash: u64, original_msb: u16) -> u16 {
    ((original_msb & 1) << 15) | ((server.0 ^ mask(flow_hash)) & ID_BITS)
}

/// What a cookie echoed in TSecr says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub server: ServerId,
    /// Parity of the server MSB this cookie replaced.
    pub version: u16,
}

#[inline]
pub fn decode(cookie: u16, flow_hash: u64) -> Decoded {
    let unmasked = unmask(cookie, flow_hash);
    Decoded {
        server: unmasked.server(),
        version: unmasked.version(),
    }
}

/// A cookie with its connection's mask taken off: `version << 15 | server id`, both
/// halves of [`Decoded`] in one word. The MSB table is indexed by it, so that restoring an
/// echo needs no arithmetic on the version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unmasked(pub u16);

impl Unmasked {
    #[inline]
    pub fn new(server: ServerId, version: u16) -> Self {
        Unmasked(((version & 1) << 15) | (server.0 & ID_BITS))
    }

    #[inline]
    pub fn server(self) -> ServerId {
        ServerId(self.0 & ID_BITS)
    }

    /// Parity of the server MSB the cookie replaced.
    #[inline]
    pub fn version(self) -> u16 {
        (self.0 & VERSION_BIT) >> 15
    }
}

/// The cookie echoed by a client, unmasked with its connection's hash.
#[inline]
pub fn unmask(cookie: u16, flow_hash: u64) -> Unmasked {
    Unmasked(cookie ^ mask(flow_hash))
}

/// TSval with its 16 MSB replaced by the cookie.
#[inline]
pub fn insert(tsval: u32, cookie: u16) -> u32 {
    ((cookie as u32) << 16) | (tsval & 0xffff)
}

/// The cookie carried in the 16 MSB of a timestamp.
#[inline]
pub fn extract(timestamp: u32) -> u16 {
    (timestamp >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decode_inverts_encode(id in 0u16..=ServerId::MAX, hash in any::<u64>(), msb in any::<u16>(), low in any::<u16>()) {
            let cookie = encode(ServerId(id), hash, msb);
            let tsval = insert((msb as u32) << 16 | low as u32, cookie);
            prop_assert_eq!(tsval & 0xffff, low as u32);
            let decoded = decode(extract(tsval), hash);
            prop_assert_eq!(decoded, Decoded { server: ServerId(id), version: msb & 1 });
        }

        #[test]
        fn unmasked_carries_the_server_and_the_version(id in 0u16..=ServerId::MAX, hash in any::<u64>(), msb in any::<u16>()) {
            let unmasked = unmask(encode(ServerId(id), hash, msb), hash);
            prop_assert_eq!(unmasked, Unmasked::new(ServerId(id), msb));
            prop_assert_eq!(unmasked.server(), ServerId(id));
            prop_assert_eq!(unmasked.version(), msb & 1);
        }

        /// Different connections to the same server carry unrelated-looking cookies.
        #[test]
        fn cookie_depends_on_the_flow(id in 0u16..=ServerId::MAX, h1 in any::<u64>(), h2 in any::<u64>()) {
            prop_assume!(mask(h1) != mask(h2));
            prop_assert_ne!(encode(ServerId(id), h1, 0), encode(ServerId(id), h2, 0));
        }
    }
}
