//! State shared by every worker of one LB process.

use std::sync::Arc;

use super::handshakes::{self, HandshakeTable};
use crate::cookie::{CookieLayout, MsbTable};
use crate::hash::{FlowHasher, Secret};
use crate::policy::SharedLoads;
use crate::tables::{Snapshot, SnapshotCell};

/// What all workers read (and, for loads, server clocks and handshakes, write rarely): the published
/// tables, the merged load counters, the per-server timestamp MSB memory, the recent SYNs
/// whose load count may have to move, and the keyed hasher.
pub struct LbShared {
    pub snapshot: SnapshotCell,
    pub loads: Arc<SharedLoads>,
    pub msb: MsbTable,
    pub handshakes: HandshakeTable,
    pub hasher: FlowHasher,
    secret_fingerprint: String,
}

impl LbShared {
    pub fn new(secret: &Secret, layout: CookieLayout, snapshot: Snapshot) -> Self {
        Self::with_handshake_slots(secret, layout, snapshot, handshakes::DEFAULT_SLOTS)
    }

    /// With a handshake table of `slots` slots: a small one lets a harness that reuses the
    /// shared state clear it cheaply between runs.
    pub fn with_handshake_slots(
        secret: &Secret,
        layout: CookieLayout,
        snapshot: Snapshot,
        slots: usize,
    ) -> Self {
        LbShared {
            snapshot: SnapshotCell::new(snapshot),
            loads: Arc::new(SharedLoads::new()),
            msb: MsbTable::new(layout),
            handshakes: HandshakeTable::with_slots(slots),
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
