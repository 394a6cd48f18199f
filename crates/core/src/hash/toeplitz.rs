//! The Microsoft RSS Toeplitz hash, as NICs compute it to spread flows over receive queues.
//!
//! Cheetah itself uses a keyed SipHash for flow hashing (it must resist attackers choosing
//! flows that collide). Toeplitz is here only as a cost baseline for benchmarks: it is what
//! the NIC already computed, so "how much dearer is SipHash than a table-driven Toeplitz?"
//! is the question worth answering, and an exact implementation keeps the comparison honest.
//!
//! # How the fast path works
//!
//! Toeplitz XORs, for every set input bit `i` (most significant bit first), the 32-bit window
//! of the key starting at key bit `i`. That is linear over XOR, so each input byte's
//! contribution depends only on its position and value. [`Toeplitz::new`] precomputes those
//! contributions, one 256-entry table per byte position of the 12-byte IPv4 tuple (12 KiB,
//! L1-resident), and hashing is then 12 table lookups XORed together.
//! [`toeplitz_reference`] is the slow bit-by-bit definition the tables are tested against.

/// RSS keys are 40 bytes.
pub const KEY_LEN: usize = 40;

/// Longest input a 40-byte key covers: a 32-bit window must fit, so 320 − 32 + 1 bits,
/// i.e. 36 whole bytes (the IPv6 4-tuple).
pub const MAX_INPUT_LEN: usize = KEY_LEN - 4;

/// Source address, destination address, source port, destination port, network order.
pub const IPV4_TUPLE_LEN: usize = 12;

/// The key from Microsoft's RSS verification suite and the default of many NIC drivers.
pub const MICROSOFT_KEY: [u8; KEY_LEN] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// `0x6d5a` repeated: a key with a 16-bit period, so the windows for the source and
/// destination fields (32 bits apart for addresses, 16 for ports) are identical and both
/// directions of a flow hash alike (Woo & Park, "Scalable TCP Session Monitoring with
/// Symmetric Receive-side Scaling").
pub const SYMMETRIC_KEY: [u8; KEY_LEN] = {
    let mut key = [0u8; KEY_LEN];
    let mut i = 0;
    while i < KEY_LEN {
        key[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    key
};

/// Table-driven Toeplitz hasher for the IPv4 4-tuple.
#[derive(Clone)]
pub struct Toeplitz {
    /// `byte_tables[position][value]` is the XOR of the key windows for the set bits of
    /// `value` at byte `position` of the input.
    byte_tables: Box<[[u32; 256]; IPV4_TUPLE_LEN]>,
}

impl Toeplitz {
    /// Precomputes the per-byte tables for `key`.
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        let mut byte_tables = Box::new([[0u32; 256]; IPV4_TUPLE_LEN]);
        for (position, table) in byte_tables.iter_mut().enumerate() {
            // Window for each bit of this byte, most significant bit first.
            let bit_windows: [u32; 8] =
                std::array::from_fn(|bit| key_window(key, position * 8 + bit));
            for (value, contribution) in table.iter_mut().enumerate() {
                *contribution = bit_windows
                    .iter()
                    .enumerate()
                    .filter(|&(bit, _)| value & (0x80 >> bit) != 0)
                    .fold(0, |acc, (_, window)| acc ^ window);
            }
        }
        Toeplitz { byte_tables }
    }

    /// Hasher with [`SYMMETRIC_KEY`]: swapping source and destination leaves the hash alone.
    pub fn symmetric() -> Self {
        Self::new(&SYMMETRIC_KEY)
    }

    /// Hash of a 12-byte IPv4 TCP/UDP tuple laid out as [`ipv4_tuple`] makes it.
    #[inline]
    pub fn hash_ipv4_tuple(&self, input: &[u8; IPV4_TUPLE_LEN]) -> u32 {
        // Fixed-size arrays on both sides: every index is provably in bounds, no checks.
        input
            .iter()
            .zip(self.byte_tables.iter())
            .fold(0, |hash, (&byte, table)| hash ^ table[usize::from(byte)])
    }

    /// Hash of an IPv4 TCP/UDP flow. Addresses are host-order `u32`s
    /// (`u32::from(Ipv4Addr)`), ports host-order `u16`s.
    #[inline]
    pub fn hash_ipv4_tcp(&self, src_ip: u32, dst_ip: u32, src_port: u16, dst_port: u16) -> u32 {
        self.hash_ipv4_tuple(&ipv4_tuple(src_ip, dst_ip, src_port, dst_port))
    }

    /// Hash of the addresses alone (RSS "IPv4 only", for non-TCP/UDP or fragments). The
    /// input is a prefix of the 4-tuple, so the first eight tables serve.
    #[inline]
    pub fn hash_ipv4_addrs(&self, src_ip: u32, dst_ip: u32) -> u32 {
        let mut input = [0u8; 8];
        input[..4].copy_from_slice(&src_ip.to_be_bytes());
        input[4..].copy_from_slice(&dst_ip.to_be_bytes());
        input
            .iter()
            .zip(self.byte_tables.iter())
            .fold(0, |hash, (&byte, table)| hash ^ table[usize::from(byte)])
    }
}

/// Lays out an IPv4 4-tuple as RSS hashes it: src addr, dst addr, src port, dst port, all in
/// network byte order. Inputs are host-order values.
pub fn ipv4_tuple(src_ip: u32, dst_ip: u32, src_port: u16, dst_port: u16) -> [u8; IPV4_TUPLE_LEN] {
    let mut input = [0u8; IPV4_TUPLE_LEN];
    input[0..4].copy_from_slice(&src_ip.to_be_bytes());
    input[4..8].copy_from_slice(&dst_ip.to_be_bytes());
    input[8..10].copy_from_slice(&src_port.to_be_bytes());
    input[10..12].copy_from_slice(&dst_port.to_be_bytes());
    input
}

/// The 32 key bits starting at bit `bit_offset` (bit 0 = most significant bit of `key[0]`).
fn key_window(key: &[u8; KEY_LEN], bit_offset: usize) -> u32 {
    let first_byte = bit_offset / 8;
    // Five bytes cover any 32-bit window; bytes past the key read as zero.
    let forty_bits = (0..5).fold(0u64, |acc, i| {
        (acc << 8) | u64::from(key.get(first_byte + i).copied().unwrap_or(0))
    });
    (forty_bits >> (8 - bit_offset % 8)) as u32
}

/// Bit-by-bit Toeplitz hash straight from the RSS specification: slow, obviously right, the
/// oracle for [`Toeplitz`].
///
/// # Panics
/// If `input` is longer than [`MAX_INPUT_LEN`] bytes, which a 40-byte key cannot cover.
pub fn toeplitz_reference(key: &[u8; KEY_LEN], input: &[u8]) -> u32 {
    assert!(
        input.len() <= MAX_INPUT_LEN,
        "a {KEY_LEN}-byte key covers at most {MAX_INPUT_LEN} input bytes, got {}",
        input.len()
    );
    let key_bit = |n: usize| u32::from(key[n / 8] >> (7 - n % 8) & 1);
    let mut result = 0u32;
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    let mut next_key_bit = 32;
    for &byte in input {
        for bit in (0..8).rev() {
            if byte >> bit & 1 == 1 {
                result ^= window;
            }
            // Slide the window one bit along the key. The last shift may run off the end of
            // the key; that window is never used.
            let incoming = if next_key_bit < KEY_LEN * 8 {
                key_bit(next_key_bit)
            } else {
                0
            };
            window = (window << 1) | incoming;
            next_key_bit += 1;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    struct Ipv4Vector {
        src: (Ipv4Addr, u16),
        dst: (Ipv4Addr, u16),
        ipv4_only: u32,
        ipv4_with_tcp: u32,
    }

    /// Microsoft's "Verifying the RSS Hash Calculation" IPv4 table.
    const IPV4_VECTORS: [Ipv4Vector; 5] = [
        Ipv4Vector {
            src: (Ipv4Addr::new(66, 9, 149, 187), 2794),
            dst: (Ipv4Addr::new(161, 142, 100, 80), 1766),
            ipv4_only: 0x323e_8fc2,
            ipv4_with_tcp: 0x51cc_c178,
        },
        Ipv4Vector {
            src: (Ipv4Addr::new(199, 92, 111, 2), 14230),
            dst: (Ipv4Addr::new(65, 69, 140, 83), 4739),
            ipv4_only: 0xd718_262a,
            ipv4_with_tcp: 0xc626_b0ea,
        },
        Ipv4Vector {
            src: (Ipv4Addr::new(24, 19, 198, 95), 12898),
            dst: (Ipv4Addr::new(12, 22, 207, 184), 38024),
            ipv4_only: 0xd2d0_a5de,
            ipv4_with_tcp: 0x5c2b_394a,
        },
        Ipv4Vector {
            src: (Ipv4Addr::new(38, 27, 205, 30), 48228),
            dst: (Ipv4Addr::new(209, 142, 163, 6), 2217),
            ipv4_only: 0x8298_9176,
            ipv4_with_tcp: 0xafc7_327f,
        },
        Ipv4Vector {
            src: (Ipv4Addr::new(153, 39, 163, 191), 44251),
            dst: (Ipv4Addr::new(202, 188, 127, 2), 1303),
            ipv4_only: 0x5d18_09c5,
            ipv4_with_tcp: 0x10e8_28a2,
        },
    ];

    #[test]
    fn table_hash_matches_microsoft_ipv4_tcp_vectors() {
        let toeplitz = Toeplitz::new(&MICROSOFT_KEY);
        for v in &IPV4_VECTORS {
            let hash = toeplitz.hash_ipv4_tcp(v.src.0.into(), v.dst.0.into(), v.src.1, v.dst.1);
            assert_eq!(hash, v.ipv4_with_tcp, "{:?} -> {:?}", v.src, v.dst);
        }
    }

    #[test]
    fn table_hash_matches_microsoft_ipv4_only_vectors() {
        let toeplitz = Toeplitz::new(&MICROSOFT_KEY);
        for v in &IPV4_VECTORS {
            let hash = toeplitz.hash_ipv4_addrs(v.src.0.into(), v.dst.0.into());
            assert_eq!(hash, v.ipv4_only, "{:?} -> {:?}", v.src.0, v.dst.0);
        }
    }

    #[test]
    fn reference_matches_microsoft_ipv4_vectors() {
        for v in &IPV4_VECTORS {
            let tuple = ipv4_tuple(v.src.0.into(), v.dst.0.into(), v.src.1, v.dst.1);
            assert_eq!(toeplitz_reference(&MICROSOFT_KEY, &tuple), v.ipv4_with_tcp);
            assert_eq!(toeplitz_reference(&MICROSOFT_KEY, &tuple[..8]), v.ipv4_only);
        }
    }

    /// The IPv6 vectors use the full 36-byte input, proving the reference is right all the
    /// way to the end of the key, not just over the IPv4 prefix.
    #[test]
    fn reference_matches_microsoft_ipv6_vectors() {
        let vectors: [(&str, u16, &str, u16, u32, u32); 3] = [
            (
                "3ffe:2501:200:1fff::7",
                2794,
                "3ffe:2501:200:3::1",
                1766,
                0x2cc1_8cd5,
                0x4020_7d3d,
            ),
            (
                "3ffe:501:8::260:97ff:fe40:efab",
                14230,
                "ff02::1",
                4739,
                0x0f0c_461c,
                0xdde5_1bbf,
            ),
            (
                "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
                44251,
                "fe80::200:f8ff:fe21:67cf",
                38024,
                0x4b61_e985,
                0x02d1_feef,
            ),
        ];
        for (src, src_port, dst, dst_port, ipv6_only, ipv6_with_tcp) in vectors {
            let mut input = Vec::with_capacity(MAX_INPUT_LEN);
            input.extend_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
            input.extend_from_slice(&dst.parse::<Ipv6Addr>().unwrap().octets());
            assert_eq!(
                toeplitz_reference(&MICROSOFT_KEY, &input),
                ipv6_only,
                "{src}"
            );
            input.extend_from_slice(&src_port.to_be_bytes());
            input.extend_from_slice(&dst_port.to_be_bytes());
            assert_eq!(
                toeplitz_reference(&MICROSOFT_KEY, &input),
                ipv6_with_tcp,
                "{src}"
            );
        }
    }

    #[test]
    fn symmetric_key_hashes_both_directions_alike() {
        let toeplitz = Toeplitz::symmetric();
        for v in &IPV4_VECTORS {
            let (src, dst) = (u32::from(v.src.0), u32::from(v.dst.0));
            let forward = toeplitz.hash_ipv4_tcp(src, dst, v.src.1, v.dst.1);
            let reverse = toeplitz.hash_ipv4_tcp(dst, src, v.dst.1, v.src.1);
            assert_eq!(forward, reverse);
        }
    }

    #[test]
    fn symmetric_key_is_0x6d5a_repeated() {
        assert!(SYMMETRIC_KEY.chunks(2).all(|pair| pair == [0x6d, 0x5a]));
    }

    #[test]
    #[should_panic(expected = "covers at most")]
    fn reference_refuses_input_longer_than_the_key_covers() {
        toeplitz_reference(&MICROSOFT_KEY, &[0; MAX_INPUT_LEN + 1]);
    }

    proptest! {
        #[test]
        fn table_hash_equals_reference(
            key in proptest::array::uniform32(any::<u8>()),
            key_tail in proptest::array::uniform8(any::<u8>()),
            input in proptest::array::uniform12(any::<u8>()),
        ) {
            let mut full_key = [0u8; KEY_LEN];
            full_key[..32].copy_from_slice(&key);
            full_key[32..].copy_from_slice(&key_tail);
            let toeplitz = Toeplitz::new(&full_key);
            prop_assert_eq!(toeplitz.hash_ipv4_tuple(&input), toeplitz_reference(&full_key, &input));
        }

        #[test]
        fn symmetric_hash_ignores_direction(
            src_ip: u32, dst_ip: u32, src_port: u16, dst_port: u16,
        ) {
            let toeplitz = Toeplitz::symmetric();
            prop_assert_eq!(
                toeplitz.hash_ipv4_tcp(src_ip, dst_ip, src_port, dst_port),
                toeplitz.hash_ipv4_tcp(dst_ip, src_ip, dst_port, src_port)
            );
        }
    }
}
