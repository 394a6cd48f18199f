//! The stateless TCP-timestamp cookie (paper section 3.1 and appendix C), with k epoch bits.
//!
//! ```text
//!  TSval toward the client:  | epoch : k | (server id XOR h) : 16 - k | server's low 16 bits |
//!  TSecr from the client:      the same 16 MSB echoed back           | low 16 bits          |
//! ```
//! `epoch` is the server's own MSB modulo 2^k: the bits the cookie displaced, all but the
//! lowest k of which the LB restores from its estimate of the server's clock (see
//! [`super::msb`]). `h` is (16 - k) bits of the keyed hash of the connection id, so the
//! cookie looks random to a client and reveals neither the id nor the key.
//!
//! # Why k epoch bits (docs/timestamps.md, "Idle connections")
//!
//! A client drops a segment whose TSval is older, in 32-bit serial arithmetic, than the
//! last one it accepted (PAWS), and a server's TCP keepalive never refreshes what the client
//! accepted. The TSval a client sees repeats every 2^k MSB periods (2^k x 65.536 s), so a
//! connection may stay silent for up to 2^(k-1) periods and no longer: k = 1 (the paper's
//! version bit) gives 65.5 s, k = 4 (the default) 524 s with 4,096 server ids. The id is
//! read from the cookie alone, whatever the server's clock; only the restore needs the
//! clock, which is why the epoch, not an offset, carries it.

use crate::types::ServerId;

/// One period of a server's timestamp MSB: 2^16 ticks of 1 ms.
pub const MSB_PERIOD_MS: u64 = 1 << 16;

/// How many bits of the cookie carry the server's clock, and so how many name the server.
///
/// Fixed when an LB first starts (its key file and state file record it): every LB
/// instance sharing a key must use the same layout, or they read each other's cookies as
/// other servers.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CookieLayout {
    epoch_bits: u8,
    id_bits: u8,
    id_mask: u16,
}

/// A width the layout cannot take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadEpochBits(pub u8);

impl std::fmt::Display for BadEpochBits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not a cookie layout: epoch bits go from {} ({} s idle, {} server ids) to {} ({} s idle, {} server ids)",
            self.0,
            CookieLayout::MIN_EPOCH_BITS,
            CookieLayout::MIN.max_idle_ms() / 1000,
            CookieLayout::MIN.server_ids(),
            CookieLayout::MAX_EPOCH_BITS,
            CookieLayout::MAX.max_idle_ms() / 1000,
            CookieLayout::MAX.server_ids(),
        )
    }
}

impl std::error::Error for BadEpochBits {}

impl CookieLayout {
    /// One bit (the paper's) leaves no room between the newest echo and the estimate of
    /// the clock: the restore needs at least a window of two periods besides the newest.
    pub const MIN_EPOCH_BITS: u8 = 2;
    pub const MAX_EPOCH_BITS: u8 = 8;
    pub const DEFAULT_EPOCH_BITS: u8 = 4;
    pub const MIN: CookieLayout = CookieLayout::of(Self::MIN_EPOCH_BITS);
    pub const MAX: CookieLayout = CookieLayout::of(Self::MAX_EPOCH_BITS);
    pub const DEFAULT: CookieLayout = CookieLayout::of(Self::DEFAULT_EPOCH_BITS);

    pub const fn new(epoch_bits: u8) -> Result<Self, BadEpochBits> {
        if epoch_bits < Self::MIN_EPOCH_BITS || epoch_bits > Self::MAX_EPOCH_BITS {
            return Err(BadEpochBits(epoch_bits));
        }
        Ok(Self::of(epoch_bits))
    }

    const fn of(epoch_bits: u8) -> Self {
        let id_bits = 16 - epoch_bits;
        CookieLayout {
            epoch_bits,
            id_bits,
            id_mask: ((1u32 << id_bits) - 1) as u16,
        }
    }

    pub const fn epoch_bits(self) -> u8 {
        self.epoch_bits
    }

    pub const fn id_bits(self) -> u8 {
        self.id_bits
    }

    /// How many server ids the cookie can name: `0..server_ids()`.
    pub const fn server_ids(self) -> usize {
        1 << self.id_bits
    }

    pub const fn max_server_id(self) -> u16 {
        self.id_mask
    }

    /// Whether `id` fits in the cookie.
    pub const fn holds(self, id: u16) -> bool {
        id <= self.id_mask
    }

    /// How many epochs there are (2^k): the TSval a client sees repeats every this many
    /// MSB periods.
    pub const fn epochs(self) -> u16 {
        1 << self.epoch_bits
    }

    /// The longest silence, in ms, after which a client still accepts the server's next
    /// segment, for every phase of the server's clock (`tcp_paws_check`): 2^(k-1) periods.
    pub const fn max_idle_ms(self) -> u64 {
        (1 << (self.epoch_bits - 1)) * MSB_PERIOD_MS
    }

    /// How many periods behind the estimate of the server's clock an echo may be and still
    /// be restored exactly (2^k - 2, with the estimate up to one period behind the server).
    pub const fn restore_window_periods(self) -> u16 {
        self.epochs() - 2
    }

    /// The id bits a connection's cookie is masked with. Taken from the upper half of the
    /// 64-bit hash so they are independent of `h % n` used by hash-based policies.
    #[inline(always)]
    pub fn mask(self, flow_hash: u64) -> u16 {
        (flow_hash >> 32) as u16 & self.id_mask
    }

    /// The 16-bit cookie for `server`, carrying the low k bits of the server's MSB.
    #[inline(always)]
    pub fn encode(self, server: ServerId, flow_hash: u64, server_msb: u16) -> u16 {
        (((server_msb as u32) << self.id_bits) as u16)
            | ((server.0 ^ self.mask(flow_hash)) & self.id_mask)
    }

    /// The cookie echoed by a client, unmasked with its connection's hash.
    #[inline(always)]
    pub fn unmask(self, cookie: u16, flow_hash: u64) -> Unmasked {
        Unmasked(cookie ^ self.mask(flow_hash))
    }

    #[inline]
    pub fn decode(self, cookie: u16, flow_hash: u64) -> Decoded {
        let unmasked = self.unmask(cookie, flow_hash);
        Decoded {
            server: self.server(unmasked),
            epoch: self.epoch(unmasked),
        }
    }

    /// The unmasked cookie of `server` in `epoch` (the low k bits of an MSB).
    #[inline]
    pub fn unmasked(self, server: ServerId, epoch: u16) -> Unmasked {
        Unmasked((((epoch as u32) << self.id_bits) as u16) | (server.0 & self.id_mask))
    }

    #[inline(always)]
    pub fn server(self, unmasked: Unmasked) -> ServerId {
        // The constant bound is already implied by the mask; spelt out, it lets the
        // compiler drop the id-space bounds check of the tables the id then indexes.
        ServerId(unmasked.0 & self.id_mask & ServerId::MAX)
    }

    #[inline(always)]
    pub fn epoch(self, unmasked: Unmasked) -> u16 {
        unmasked.0 >> self.id_bits
    }
}

impl Default for CookieLayout {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::fmt::Debug for CookieLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CookieLayout(epoch_bits = {})", self.epoch_bits)
    }
}

/// What a cookie echoed in TSecr says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub server: ServerId,
    /// The server MSB this cookie replaced, modulo 2^k.
    pub epoch: u16,
}

/// A cookie with its connection's mask taken off: `epoch << (16 - k) | server id`, both
/// halves of [`Decoded`] in one word. The MSB table is indexed by it, so that restoring an
/// echo needs no arithmetic on the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unmasked(pub u16);

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

    fn layouts() -> impl Strategy<Value = CookieLayout> {
        (CookieLayout::MIN_EPOCH_BITS..=CookieLayout::MAX_EPOCH_BITS)
            .prop_map(|k| CookieLayout::new(k).unwrap())
    }

    #[test]
    fn widths_outside_the_table_are_refused_with_the_range() {
        for k in [0, 1, 9, 16] {
            let error = CookieLayout::new(k).unwrap_err();
            assert_eq!(error, BadEpochBits(k));
            assert!(
                error
                    .to_string()
                    .contains("from 2 (131 s idle, 16384 server ids) to 8"),
                "{error}"
            );
        }
        let default = CookieLayout::default();
        assert_eq!(default.epoch_bits(), 4);
        assert_eq!(default.server_ids(), 4096);
        assert_eq!(default.max_server_id(), 4095);
        assert_eq!(default.max_idle_ms(), 524_288);
        assert_eq!(default.restore_window_periods(), 14);
        assert!(CookieLayout::MIN.server_ids() <= ServerId::SPACE);
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(layout in layouts(), id in any::<u16>(), hash in any::<u64>(), msb in any::<u16>(), low in any::<u16>()) {
            let id = id & layout.max_server_id();
            let cookie = layout.encode(ServerId(id), hash, msb);
            let tsval = insert((msb as u32) << 16 | low as u32, cookie);
            prop_assert_eq!(tsval & 0xffff, low as u32);
            let decoded = layout.decode(extract(tsval), hash);
            prop_assert_eq!(decoded, Decoded { server: ServerId(id), epoch: msb & (layout.epochs() - 1) });
            let unmasked = layout.unmask(cookie, hash);
            prop_assert_eq!(unmasked, layout.unmasked(ServerId(id), msb & (layout.epochs() - 1)));
        }

        /// The top k bits of the cookie are the server's MSB mod 2^k in the clear: they are
        /// what makes the client-visible TSval advance with the server's clock.
        #[test]
        fn the_epoch_is_the_top_of_the_cookie(layout in layouts(), id in any::<u16>(), hash in any::<u64>(), msb in any::<u16>()) {
            let cookie = layout.encode(ServerId(id & layout.max_server_id()), hash, msb);
            prop_assert_eq!(cookie >> layout.id_bits(), msb & (layout.epochs() - 1));
        }

        /// Different connections to the same server carry unrelated-looking cookies.
        #[test]
        fn cookie_depends_on_the_flow(layout in layouts(), id in any::<u16>(), h1 in any::<u64>(), h2 in any::<u64>()) {
            prop_assume!(layout.mask(h1) != layout.mask(h2));
            let id = ServerId(id & layout.max_server_id());
            prop_assert_ne!(layout.encode(id, h1, 0), layout.encode(id, h2, 0));
        }
    }
}
