//! What the prober decided, for everyone else to read: per (VIP, server), the state, its
//! reason, since when, and the probes by result. The prober writes it; the API, `ctl` and
//! the metrics read it. The pools themselves follow the control plane's health overlay,
//! which the prober keeps equal to this.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Instant;

use cheetah_core::tables::control::VipKey;
use cheetah_core::tables::Health;
use cheetah_core::types::ServerId;

use super::state::{HealthMachine, ProbeOutcome};

/// One (VIP, server) as the prober last decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthStatus {
    pub state: Health,
    pub reason: String,
    pub since: Instant,
    /// Probes that decided health, by [`ProbeOutcome::RESULTS`] (same index).
    pub probes: [u64; ProbeOutcome::RESULTS.len()],
}

pub type TargetKey = (VipKey, ServerId);

#[derive(Debug, Default)]
pub struct HealthBook {
    entries: Mutex<BTreeMap<TargetKey, HealthStatus>>,
}

impl HealthBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<TargetKey, HealthStatus>> {
        // Every write is whole: a panic while it was held leaves it consistent.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, key: &TargetKey) -> Option<HealthStatus> {
        self.lock().get(key).cloned()
    }

    pub fn all(&self) -> BTreeMap<TargetKey, HealthStatus> {
        self.lock().clone()
    }

    /// Records `machine`'s state, and the probe that led there (`None` for a new target).
    pub fn update(&self, key: TargetKey, machine: &HealthMachine, probe: Option<&ProbeOutcome>) {
        let mut entries = self.lock();
        let entry = entries.entry(key).or_insert_with(|| HealthStatus {
            state: machine.state(),
            reason: String::new(),
            since: machine.since(),
            probes: [0; ProbeOutcome::RESULTS.len()],
        });
        entry.state = machine.state();
        entry.reason = machine.reason().to_string();
        entry.since = machine.since();
        if let Some(probe) = probe {
            let index = ProbeOutcome::RESULTS
                .iter()
                .position(|r| *r == probe.result())
                .expect("every result is listed");
            entry.probes[index] += 1;
        }
    }

    /// Forgets every target but `keep` (servers removed, or out of a pool).
    pub fn retain(&self, keep: &BTreeSet<TargetKey>) {
        self.lock().retain(|key, _| keep.contains(key));
    }
}
