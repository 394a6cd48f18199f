//! State shared by every worker of one LB process.

use std::sync::Arc;

use crate::cookie::MsbTable;
use crate::hash::{FlowHasher, Secret};
use crate::policy::SharedLoads;
use crate::tables::{Snapshot, SnapshotCell};

/// What all workers read (and, for loads and M, write rarely): the published tables, the
/// merged load counters, the per-server timestamp MSB memory and the keyed hasher.
pub struct LbShared {
    pub snapshot: SnapshotCell,
    pub loads: Arc<SharedLoads>,
    pub msb: MsbTable,
    pub hasher: FlowHasher,
    secret_fingerprint: String,
}

impl LbShared {
    pub fn new(secret: &Secret, snapshot: Snapshot) -> Self {
        LbShared {
            snapshot: SnapshotCell::new(snapshot),
            loads: Arc::new(SharedLoads::new()),
            msb: MsbTable::new(),
            hasher: FlowHasher::new(secret),
            secret_fingerprint: secret.fingerprint(),
        }
    }

    /// Public fingerprint of the secret, to check that LB instances share one key.
    pub fn secret_fingerprint(&self) -> &str {
        &self.secret_fingerprint
    }
}
