//! State shared by every worker of one LB process.

use std::sync::Arc;

use super::closes::{self, CloseFilter};
use super::fallback::FallbackTable;
use super::handshakes::HandshakeTable;
use crate::cookie::{CookieLayout, MsbTable};
use crate::hash::{FlowHasher, Secret};
use crate::policy::SharedLoads;
use crate::tables::{Snapshot, SnapshotCell};

/// The tables of an [`LbShared`] that may live in memory the XDP program shares (the
/// clock table's packet words, the handshake table, the fallback table), made for a plane
/// by the caller of `ControlPlane::new_with_tables` for the config's cookie layout and
/// `fallback_table_capacity`.
pub struct SharedTables {
    pub msb: MsbTable,
    pub handshakes: HandshakeTable,
    pub fallback: FallbackTable,
}

impl SharedTables {
    /// Every table in this process's own memory: the handshake table at its default size,
    /// the fallback table for `fallback_capacity` flows (rounded as
    /// [`FallbackTable::rounded_capacity`] says).
    pub fn new(layout: CookieLayout, fallback_capacity: usize) -> Self {
        SharedTables {
            msb: MsbTable::new(layout),
            handshakes: HandshakeTable::default(),
            fallback: FallbackTable::with_capacity(fallback_capacity),
        }
    }
}

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
        Self::with_tables(
            secret,
            SharedTables::new(layout, fallback_capacity),
            snapshot,
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
        let tables = SharedTables {
            msb: MsbTable::new(layout),
            handshakes: HandshakeTable::with_slots(slots),
            fallback: FallbackTable::with_capacity(fallback_capacity),
        };
        Self::with_sizes(secret, tables, snapshot, slots)
    }

    /// [`new`](LbShared::new) with `tables` (e.g. over words shared with the XDP program,
    /// [`MsbTable::with_words`], [`HandshakeTable::with_words`],
    /// [`FallbackTable::with_words`]); the cookie layout is the clock table's.
    pub fn with_tables(secret: &Secret, tables: SharedTables, snapshot: Snapshot) -> Self {
        Self::with_sizes(secret, tables, snapshot, closes::DEFAULT_SLOTS)
    }

    fn with_sizes(
        secret: &Secret,
        tables: SharedTables,
        snapshot: Snapshot,
        close_slots: usize,
    ) -> Self {
        let SharedTables {
            msb,
            handshakes,
            fallback,
        } = tables;
        let layout = msb.layout();
        LbShared {
            snapshot: SnapshotCell::new(snapshot),
            loads: Arc::new(SharedLoads::new()),
            msb,
            handshakes,
            closes: CloseFilter::with_slots(close_slots),
            fallback,
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
