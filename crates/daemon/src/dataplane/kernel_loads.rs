//! Folds what the XDP program's in-kernel path counted per server (`server_traffic`) into
//! the core's load totals, which the load-aware policies read at their workers' next
//! merge: traffic as a worker's `on_packet`, each connection the kernel placed as a
//! policy's pick (+1 active, +1 new connection), each count it released (a retransmitted
//! SYN's earlier pick, a counted close) as -1 active, clamped as the core clamps. And the
//! other way: the load totals pow2 in the kernel compares (`server_loads`), and the loads
//! a core worker's policies would see (`view`), from which the daemon derives what the
//! kernel's load-aware policies follow (awrr's cycles: `awrr_schedules.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use cheetah_core::lb::LbShared;
use cheetah_core::policy::{LoadView, SharedLoads, WorkerLoads};
use cheetah_core::tables::SlotState;
use cheetah_core::types::ServerId;

use super::xdp::SteeringProgram;
use super::xdp_layout::{ServerLoadValue, ServerTraffic};

/// The per-CPU totals grow from 0 since the program was loaded; each fold adds what they
/// grew by since the last.
pub struct KernelLoads {
    seen: HashMap<ServerId, ServerTraffic>,
    published: HashMap<ServerId, ServerLoadValue>,
    /// A worker's view of the LB's loads (it picks nothing itself), watching every pooled
    /// server, merged at every fold after the kernel's counts went in.
    view: WorkerLoads,
}

impl Default for KernelLoads {
    fn default() -> Self {
        KernelLoads {
            seen: HashMap::new(),
            published: HashMap::new(),
            // Over the LB's totals from the first fold on.
            view: WorkerLoads::new(Arc::new(SharedLoads::new())),
        }
    }
}

impl KernelLoads {
    /// Folds from what `server_traffic` holds now: totals an earlier run left in a pinned
    /// map were that run's to fold (its loads went with it), not this one's.
    pub fn starting_at(steering: &SteeringProgram) -> anyhow::Result<Self> {
        let mut loads = KernelLoads::default();
        if steering.pins().kept(&["server_traffic"]) {
            let ids: Vec<ServerId> = (0..ServerId::SPACE as u16).map(ServerId).collect();
            let totals = steering.server_traffic(&ids)?;
            loads.seen = ids.into_iter().zip(totals).collect();
        }
        Ok(loads)
    }

    pub fn fold(&mut self, steering: &SteeringProgram, shared: &LbShared) -> anyhow::Result<()> {
        let snapshot = shared.snapshot.load();
        let ids: Vec<ServerId> = snapshot
            .servers
            .iter()
            .filter(|(_, slot)| slot.state != SlotState::Free)
            .map(|(id, _)| id)
            .collect();
        let totals = steering.server_traffic(&ids)?;
        for (id, total) in ids.into_iter().zip(totals) {
            let before = self.seen.insert(id, total).unwrap_or_default();
            let grew = total.wrapping_sub(before);
            if grew.packets != 0 || grew.bytes != 0 {
                shared.loads.add_traffic(id, grew.packets, grew.bytes);
            }
            if grew.opened != 0 || grew.closed != 0 {
                shared.loads.add_kernel_counts(id, grew.opened, grew.closed);
            }
        }
        if !Arc::ptr_eq(self.view.shared(), &shared.loads) {
            self.view = WorkerLoads::new(Arc::clone(&shared.loads));
        }
        let mut pooled: Vec<ServerId> = snapshot
            .vips
            .iter()
            .flat_map(|vip| vip.pool.servers.iter().copied())
            .collect();
        pooled.sort_unstable();
        pooled.dedup();
        self.view.watch(&pooled);
        self.view.merge(crate::clock::monotonic_ns());
        Ok(())
    }

    /// The loads a core worker's policies would see after the last fold.
    pub fn view(&self) -> &LoadView {
        self.view.view()
    }

    /// Publishes each allocated server's load totals for pow2 in the kernel, changed ones
    /// only. What a core worker's pow2 compares is its own view: the totals at its last
    /// merge (every 10 ms) plus its own picks since; the kernel compares the totals at the
    /// last call (the daemon calls it every 50 ms, right after `fold`), without the picks
    /// it made since: up to about 50 ms staler, which pow2 tolerates by design (two random
    /// candidates, not the one least loaded, so stale loads do not herd).
    pub fn publish_loads(
        &mut self,
        steering: &SteeringProgram,
        shared: &LbShared,
    ) -> anyhow::Result<()> {
        let snapshot = shared.snapshot.load();
        for (id, slot) in snapshot.servers.iter() {
            if slot.state == SlotState::Free {
                continue;
            }
            let value = server_load(shared, id);
            if self.published.get(&id) != Some(&value) {
                steering.set_server_load(id, &value)?;
                self.published.insert(id, value);
            }
        }
        Ok(())
    }
}

/// `struct server_load` of `id`'s totals: what `LoadView::load` gives under each metric
/// the kernel compares, in integers that order as those f64s do.
pub fn server_load(shared: &LbShared, id: ServerId) -> ServerLoadValue {
    let load = shared.loads.server(id);
    let reported = if load.reported_load == 0.0 {
        0
    } else {
        load.reported_load.to_bits()
    };
    ServerLoadValue {
        active: load.active_connections,
        reported,
    }
}
