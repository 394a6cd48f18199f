//! State shared by every worker of one LB process.

use std::sync::Arc;

use super::closes::{self, CloseFilter};
use super::fallback::FallbackTable;
use super::handshakes::{self, HandshakeTable};
use crate::cookie::{CookieLayout, MsbTable};
use crate::hash::{FlowHasher, Secret};
use crate::policy::SharedLoads;
use crate::tables::{Snapshot, SnapshotCell};

/// What all workers read (and, for loads, server clocks, handshakes, closes and the fallback
/// table, write rarely): the published tables, the merged load counters, the per-server
/// timestamp MSB memory, the recent SYNs whose load count may have to move, the recent
/// server closes already counted, the connections routed without a cookie, and the keyed
/// hasher.
pub struct LbShared {
    pub snapshot: SnapshotCell,
    pub loads: Arc<SharedLoads>,
    pub msb: MsbTable,
    pub handshakes: HandshakeTable,
    /// The last close counted per slot (`lb/closes.rs`): one for all workers, since the
    /// FIN and the RST of one connection may reach different ones.
    pub closes: CloseFilter,
    /// Flow -> server for connections without a usable cookie (`lb/fallback.rs`): one for
    /// all workers, since a connection's packets reach several.
    pub fallback: FallbackTable,
    pub hasher: FlowHasher,
    secret_fingerprint: String,
}

impl LbShared {
    /// With a fallback table for `fallback_capacity` flows (the config's
    /// `fallback_table_capacity`, rounded as [`FallbackTable::rounded_capacity`] says).
    pub fn new(
        secret: &Secret,
        layout: CookieLayout,
        snapshot: Snapshot,
        fallback_capacity: usize,
    ) -> Self {
        Self::with_sizes(
            secret,
            MsbTable::new(layout),
            snapshot,
            handshakes::DEFAULT_SLOTS,
            closes::DEFAULT_SLOTS,
            fallback_capacity,
        )
    }

    /// With a handshake table and a close filter of `slots` slots each: small tables let a
    /// harness that reuses the shared state clear them cheaply between runs.
    pub fn with_table_sizes(
        secret: &Secret,
        layout: CookieLayout,
        snapshot: Snapshot,
        slots: usize,
        fallback_capacity: usize,
    ) -> Self {
        let msb = MsbTable::new(layout);
        Self::with_sizes(secret, msb, snapshot, slots, slots, fallback_capacity)
    }

    /// [`new`](LbShared::new) with the clock table `msb` (e.g. one over words shared with
    /// the XDP program, [`MsbTable::with_words`]); the cookie layout is `msb`'s.
    pub fn with_msb(
        secret: &Secret,
        msb: MsbTable,
        snapshot: Snapshot,
        fallback_capacity: usize,
    ) -> Self {
        Self::with_sizes(
            secret,
            msb,
            snapshot,
            handshakes::DEFAULT_SLOTS,
            closes::DEFAULT_SLOTS,
            fallback_capacity,
        )
    }

    fn with_sizes(
        secret: &Secret,
        msb: MsbTable,
        snapshot: Snapshot,
        handshake_slots: usize,
        close_slots: usize,
        fallback_capacity: usize,
    ) -> Self {
        let layout = msb.layout();
        LbShared {
            snapshot: SnapshotCell::new(snapshot),
            loads: Arc::new(SharedLoads::new()),
            msb,
            handshakes: HandshakeTable::with_slots(handshake_slots),
            closes: CloseFilter::with_slots(close_slots),
            fallback: FallbackTable::with_capacity(fallback_capacity),
            hasher: FlowHasher::new(secret),
            secret_fingerprint: secret.fingerprint(layout),
        }
    }

    /// The cookie layout (also in `msb`, which restores by it).
    #[inline(always)]
    pub fn layout(&self) -> CookieLayout {
        self.msb.layout()
    }

    /// Public fingerprint of the secret and the cookie layout, to check that LB instances
    /// read each other's cookies.
    pub fn secret_fingerprint(&self) -> &str {
        &self.secret_fingerprint
    }
}
