//! SipHash-1-3 of the canonical connection id, keyed with the LB's 128-bit secret.
//!
//! Why a keyed PRF: the cookie is `server id XOR hash(conn id)`; if the hash were guessable
//! a client could mint cookies that pin many connections on one server. SipHash with a
//! secret key reveals nothing about the key from observed cookies, and SipHash-1-3 over 14
//! bytes is five SipRounds: cheap enough for the per-packet path here and inside an XDP
//! program, which would have to compute bit-identical values.
//!
//! Why hand-written: the `siphasher` crate's streaming `Hasher` buffers bytes one `write`
//! at a time; this fixed-layout version loads the id as two words and is several times
//! faster. The tests hold it to `siphasher` for random keys and ids.
//!
//! Canonical orientation: the VIP's side first (VIP ip, VIP port, protocol, one zero byte),
//! then the client's (client ip, client port), so the client->server and server->client
//! packets of a connection hash the same. The VIP's side fills the first 8-byte word
//! exactly, so the state after it is the same for every connection to that VIP: a
//! [`VipHashPrefix`] computed once per VIP and snapshot leaves four of the five SipRounds
//! per packet (`Snapshot::vip_hash_prefix`).

use std::fmt;

/// The 128-bit secret shared by every LB instance that must read the same cookies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; 16]);

impl Secret {
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 32 {
            return None;
        }
        let mut key = [0u8; 16];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Secret(key))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A short public fingerprint, so operators can check that LB instances share a key
    /// and a cookie layout (both must agree for instances to read each other's cookies)
    /// without revealing the key: the hash of a fixed id, naming the layout, under the key.
    pub fn fingerprint(&self, layout: crate::cookie::CookieLayout) -> String {
        let probe = FlowKey {
            client_ip: 0,
            vip_ip: 0,
            client_port: 0,
            vip_port: layout.epoch_bits() as u16,
            protocol: 0,
        };
        format!("{:016x}", FlowHasher::new(self).hash(&probe))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Secret(fingerprint {})",
            self.fingerprint(crate::cookie::CookieLayout::DEFAULT)
        )
    }
}

/// The canonical IPv4 connection id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub client_ip: u32,
    pub vip_ip: u32,
    pub client_port: u16,
    pub vip_port: u16,
    pub protocol: u8,
}

impl FlowKey {
    /// The id of a TCP connection between `client` and a VIP.
    #[inline]
    pub fn tcp(client_ip: u32, client_port: u16, vip_ip: u32, vip_port: u16) -> Self {
        FlowKey {
            client_ip,
            vip_ip,
            client_port,
            vip_port,
            protocol: crate::wire::ip_proto::TCP,
        }
    }

    /// The 14 bytes that are hashed: the VIP's word, then the client's, in network order.
    pub fn to_bytes(&self) -> [u8; 14] {
        let mut b = [0u8; 14];
        b[0..4].copy_from_slice(&self.vip_ip.to_be_bytes());
        b[4..6].copy_from_slice(&self.vip_port.to_be_bytes());
        b[6] = self.protocol;
        b[8..12].copy_from_slice(&self.client_ip.to_be_bytes());
        b[12..14].copy_from_slice(&self.client_port.to_be_bytes());
        b
    }
}

/// SipHash-1-3 keyed with a [`Secret`].
#[derive(Clone, Copy)]
pub struct FlowHasher {
    /// SipHash's initial state for this key (the key XOR the four constants), computed
    /// once instead of per hash.
    init: [u64; 4],
}

impl fmt::Debug for FlowHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The state is the key in thin disguise: show nothing of it.
        f.write_str("FlowHasher { .. }")
    }
}

#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

impl FlowHasher {
    pub fn new(secret: &Secret) -> Self {
        let k0 = u64::from_le_bytes(secret.0[0..8].try_into().unwrap());
        let k1 = u64::from_le_bytes(secret.0[8..16].try_into().unwrap());
        FlowHasher {
            init: [
                k0 ^ 0x736f6d6570736575,
                k1 ^ 0x646f72616e646f6d,
                k0 ^ 0x6c7967656e657261,
                k1 ^ 0x7465646279746573,
            ],
        }
    }

    /// The state after the id's first word, which holds only the VIP's side. Inlined so
    /// that [`hash`](Self::hash) keeps the state in registers.
    #[inline(always)]
    pub fn vip_prefix(&self, vip_ip: u32, vip_port: u16, protocol: u8) -> VipHashPrefix {
        // Little-endian word of bytes 0..8: the VIP address and port in network order,
        // the protocol, a zero byte.
        let m = (vip_ip.swap_bytes() as u64)
            | ((vip_port.swap_bytes() as u64) << 32)
            | ((protocol as u64) << 48);
        let mut v = self.init;
        v[3] ^= m;
        sip_round(&mut v);
        v[0] ^= m;
        VipHashPrefix { state: v }
    }

    /// SipHash-1-3 of `key.to_bytes()`, computed without materialising the bytes: the
    /// slow paths' way; the fast paths finish their VIP's [`VipHashPrefix`] instead.
    #[inline(always)]
    pub fn hash(&self, key: &FlowKey) -> u64 {
        self.vip_prefix(key.vip_ip, key.vip_port, key.protocol)
            .finish(key.client_ip, key.client_port)
    }
}

/// SipHash's state after the first word of every id of one VIP, port and protocol.
#[derive(Clone, Copy)]
pub struct VipHashPrefix {
    state: [u64; 4],
}

impl fmt::Debug for VipHashPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One SipRound away from the key: show nothing of it.
        f.write_str("VipHashPrefix { .. }")
    }
}

impl VipHashPrefix {
    /// SipHash's state after the VIP's word, for the XDP program's maps (`vip_info.hash_prefix`
    /// in bpf/include/cheetah_shared.h), whose `siphash_finish` (bpf/lib/siphash.h) finishes
    /// it as [`finish`](Self::finish) does. One SipRound away from the key: keep it out of
    /// logs, as the key.
    pub fn state(&self) -> [u64; 4] {
        self.state
    }

    /// The hash of the id of `client_ip:client_port` with this prefix's VIP. Always
    /// inlined: the per-packet paths pass values already in registers.
    #[inline(always)]
    pub fn finish(&self, client_ip: u32, client_port: u16) -> u64 {
        // Little-endian word of bytes 8..14 (client address and port in network order)
        // with the length, 14, in the top byte.
        let m = (client_ip.swap_bytes() as u64)
            | ((client_port.swap_bytes() as u64) << 32)
            | (14u64 << 56);
        let mut v = self.state;
        v[3] ^= m;
        sip_round(&mut v);
        v[0] ^= m;
        v[2] ^= 0xff;
        sip_round(&mut v);
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^ v[1] ^ v[2] ^ v[3]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use siphasher::sip::SipHasher13;
    use std::hash::Hasher;

    fn reference(secret: &Secret, key: &FlowKey) -> u64 {
        let mut h = SipHasher13::new_with_key(&secret.0);
        h.write(&key.to_bytes());
        h.finish()
    }

    proptest! {
        #[test]
        fn equals_reference_siphash13(key in any::<[u8; 16]>(), ci in any::<u32>(), vi in any::<u32>(),
                                      cp in any::<u16>(), vp in any::<u16>(), proto in any::<u8>()) {
            let secret = Secret(key);
            let flow = FlowKey { client_ip: ci, vip_ip: vi, client_port: cp, vip_port: vp, protocol: proto };
            prop_assert_eq!(FlowHasher::new(&secret).hash(&flow), reference(&secret, &flow));
        }

        #[test]
        fn prefix_finish_equals_the_whole_hash(key in any::<[u8; 16]>(), ci in any::<u32>(), vi in any::<u32>(),
                                               cp in any::<u16>(), vp in any::<u16>(), proto in any::<u8>()) {
            let hasher = FlowHasher::new(&Secret(key));
            let flow = FlowKey { client_ip: ci, vip_ip: vi, client_port: cp, vip_port: vp, protocol: proto };
            prop_assert_eq!(hasher.vip_prefix(vi, vp, proto).finish(ci, cp), hasher.hash(&flow));
        }
    }

    /// The byte layout is a contract between LB instances (they must read each other's
    /// cookies): pinned here by bytes written out by hand, not by `to_bytes`.
    #[test]
    fn layout_is_vip_word_then_client_word() {
        let secret = Secret(*b"0123456789abcdef");
        let flow = FlowKey::tcp(0x0a00_0001, 40000, 0x0a63_0001, 80);
        let bytes = [10, 99, 0, 1, 0, 80, 6, 0, 10, 0, 0, 1, 0x9c, 0x40];
        assert_eq!(flow.to_bytes(), bytes);
        let mut h = SipHasher13::new_with_key(&secret.0);
        h.write(&bytes);
        assert_eq!(FlowHasher::new(&secret).hash(&flow), h.finish());
    }

    #[test]
    fn secret_hex_round_trips_and_rejects_garbage() {
        let s = Secret::from_hex("000102030405060708090a0b0c0d0e0f").unwrap();
        assert_eq!(s.0[15], 15);
        assert_eq!(s.to_hex(), "000102030405060708090a0b0c0d0e0f");
        assert!(Secret::from_hex("0001").is_none());
        assert!(Secret::from_hex("zz0102030405060708090a0b0c0d0e0f").is_none());
    }

    #[test]
    fn fingerprint_depends_on_the_key_and_the_layout_and_not_shows_it() {
        use crate::cookie::CookieLayout;
        let a = Secret([1; 16]);
        let b = Secret([2; 16]);
        let k4 = CookieLayout::DEFAULT;
        assert_ne!(a.fingerprint(k4), b.fingerprint(k4));
        assert_ne!(
            a.fingerprint(k4),
            a.fingerprint(CookieLayout::new(3).unwrap())
        );
        assert_eq!(
            a.fingerprint(k4),
            a.fingerprint(CookieLayout::new(4).unwrap())
        );
        assert!(!format!("{a:?}").contains(&a.to_hex()));
        assert_eq!(format!("{:?}", FlowHasher::new(&a)), "FlowHasher { .. }");
        assert_eq!(
            format!("{:?}", FlowHasher::new(&a).vip_prefix(1, 2, 6)),
            "VipHashPrefix { .. }"
        );
    }
}
