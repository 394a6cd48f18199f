//! Folds what the XDP program's in-kernel path counted per server (`server_traffic`) into
//! the core's load totals, which the load-aware policies read at their workers' next
//! merge: traffic as a worker's `on_packet`, each connection the kernel placed as a
//! policy's pick (+1 active, +1 new connection), each count it released (a retransmitted
//! SYN's earlier pick, a counted close, a count a SYN-ACK moved away) as -1 active, each
//! count a SYN-ACK moved in as +1 active, clamped as the core clamps.
//!
//! And the other way: each CPU's load view, which pow2 and least loaded in the kernel
//! compare. A core worker's view is the totals at its last merge plus its own picks and
//! closes since; CPU `c`'s is the same with the fold for the merge: the loads of `view` (a
//! [`WorkerLoads`] merged right after the kernel's counts are added, so its rates are a
//! worker's moving averages) plus what `c` counted since the fold. The kernel reads it
//! from two mmapable arrays, one plain read a server once a pick has looked its row up:
//! `active_rows`, a row per CPU indexed by server id, each entry a `base` this fold writes
//! and an `own` only `c`'s program writes (opened + moved_in - closed, counted beside
//! `server_traffic`'s three, so always their `active_delta` once a program run is over);
//! and `published_loads`, a row per metric (report, packet and byte rates, the same for
//! every CPU). Both are written through mappings, an aligned 8-byte store a word, so
//! neither side's store covers a word of the other's.
//!
//! The base and its race with the kernel's picks: the fold reads every CPU's
//! `server_traffic` once (`per_cpu`), adds what grew into the totals, merges, and
//! publishes `base = active - (opened_c + moved_in_c - closed_c)` with c's counts from that
//! same read. A pick `c` makes before the read is in `active` and in the subtracted
//! counts, so base + own counts it once; a pick after the read is in neither (the next
//! fold adds it to the totals) but in `own`, so the view counts it once as well, as a
//! worker's own delta. Between the read and the store of the new base the kernel still
//! adds its picks to the old base, exactly as a worker's view is the last merge plus its
//! own deltas until the next merge. `own` and `server_traffic` start together (created,
//! and pinned, together; `active_rows` is sized by the possible CPUs, which do not change
//! while a BPF filesystem's pins live), so the subtracted counts are `own`'s at the read.
//! The daemon also derives from `view` what the kernel's awrr follows (its cycles:
//! `awrr_schedules.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use cheetah_core::lb::LbShared;
use cheetah_core::policy::{LoadMetric, LoadView, SharedLoads, WorkerLoads};
use cheetah_core::tables::SlotState;
use cheetah_core::types::{Nanos, ServerId};

use super::xdp::SteeringProgram;
use super::xdp_layout::{ServerLoadValue, ServerTraffic};
use crate::clock::monotonic_ns;

/// The per-CPU totals grow from 0 since the program was loaded; each fold adds what they
/// grew by since the last.
pub struct KernelLoads {
    seen: HashMap<ServerId, ServerTraffic>,
    /// What each id's view holds (per CPU), so that only changes are written.
    published: HashMap<ServerId, Vec<ServerLoadValue>>,
    /// The loads a core worker's policies would see at this fold.
    view: WorkerLoads,
    /// The ids `view` watches: the union of the snapshot's pools when last given.
    watched: Vec<ServerId>,
}

impl KernelLoads {
    pub fn new(loads: Arc<SharedLoads>) -> Self {
        KernelLoads {
            seen: HashMap::new(),
            published: HashMap::new(),
            view: WorkerLoads::new(loads),
            watched: Vec::new(),
        }
    }

    /// Folds from what `server_traffic` holds now: totals an earlier run left in a pinned
    /// map were that run's to fold (its loads went with it), not this one's.
    pub fn starting_at(
        steering: &SteeringProgram,
        loads: Arc<SharedLoads>,
    ) -> anyhow::Result<Self> {
        let mut kernel_loads = KernelLoads::new(loads);
        let pins = steering.pins();
        if pins.kept(&["server_traffic"]) != pins.kept(&["active_rows"]) {
            // Only by hand (a pin removed): the bases then miss the kernel's counts before.
            tracing::warn!("the XDP program's server_traffic and active_rows were not both kept; the kernel's load views are off by the connections counted before this run until they close");
        }
        if pins.kept(&["server_traffic"]) {
            let ids: Vec<ServerId> = (0..ServerId::SPACE as u16).map(ServerId).collect();
            let totals = steering.server_traffic(&ids)?;
            kernel_loads.seen = ids.into_iter().zip(totals).collect();
        }
        Ok(kernel_loads)
    }

    /// The loads a core worker's policies would see at the last fold, which each CPU's
    /// view starts from.
    pub fn view(&self) -> &LoadView {
        self.view.view()
    }

    /// [`fold_at`](Self::fold_at) the daemon's clock.
    pub fn fold(&mut self, steering: &SteeringProgram, shared: &LbShared) -> anyhow::Result<()> {
        self.fold_at(steering, shared, monotonic_ns())
    }

    /// Adds what the kernel counted since the last fold to the core's totals, merges the
    /// view at `now` (the rates' clock), and publishes each CPU's view of every pool
    /// member whose published value changed.
    pub fn fold_at(
        &mut self,
        steering: &SteeringProgram,
        shared: &LbShared,
        now: Nanos,
    ) -> anyhow::Result<()> {
        let snapshot = shared.snapshot.load();
        let mut per_cpu = HashMap::new();
        for (id, slot) in snapshot.servers.iter() {
            if slot.state == SlotState::Free {
                continue;
            }
            let cpus = steering.server_traffic_per_cpu(id)?;
            let total = cpus
                .iter()
                .copied()
                .fold(ServerTraffic::default(), ServerTraffic::wrapping_add);
            let before = self.seen.insert(id, total).unwrap_or_default();
            let grew = total.wrapping_sub(before);
            if grew.packets != 0 || grew.bytes != 0 {
                shared.loads.add_traffic(id, grew.packets, grew.bytes);
            }
            if grew.opened != 0 || grew.moved_in != 0 || grew.closed != 0 {
                shared
                    .loads
                    .add_kernel_counts(id, grew.opened, grew.moved_in, grew.closed);
            }
            per_cpu.insert(id, cpus);
        }

        let mut pooled: Vec<ServerId> = snapshot
            .vips
            .iter()
            .flat_map(|vip| vip.pool.servers.iter().copied())
            .collect();
        pooled.sort_unstable();
        pooled.dedup();
        if pooled != self.watched {
            self.view.watch(&pooled);
            self.watched = pooled;
        }
        self.view.merge(now);

        for &id in &self.watched {
            let cpus = match per_cpu.remove(&id) {
                Some(cpus) => cpus,
                None => steering.server_traffic_per_cpu(id)?,
            };
            let values = published_loads(self.view.view(), id, &cpus);
            if self.published.get(&id) != Some(&values) {
                steering.set_server_load(id, &values)?;
                self.published.insert(id, values);
            }
        }
        Ok(())
    }
}

/// Each CPU's view of `id` ([`ServerLoadValue`]): `view`'s loads, and the active-connection
/// base from which the kernel counts the CPU's own picks and closes (`per_cpu`: each CPU's
/// `server_traffic` for `id` as read at this fold).
pub fn published_loads(
    view: &LoadView,
    id: ServerId,
    per_cpu: &[ServerTraffic],
) -> Vec<ServerLoadValue> {
    let active = i64::try_from(view.active_connections(id)).unwrap_or(i64::MAX);
    let shared = ServerLoadValue {
        active_base: 0,
        reported: ordered_bits(view.load(id, LoadMetric::Reported)),
        packet_rate: ordered_bits(view.load(id, LoadMetric::Packets)),
        byte_rate: ordered_bits(view.load(id, LoadMetric::Bytes)),
    };
    per_cpu
        .iter()
        .map(|cpu| ServerLoadValue {
            // Wrapping, as the kernel adds it back: the counts grow without bound.
            active_base: active.wrapping_sub(cpu.active_delta()),
            ..shared
        })
        .collect()
}

/// A load as the kernel compares it, an integer: the bits of a positive f64 order as the
/// floats do. Zero, and what no core load is (negative, NaN), is +0.0's.
pub fn ordered_bits(load: f64) -> u64 {
    if load > 0.0 {
        load.to_bits()
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_bits_order_as_the_loads_do() {
        let loads = [0.0, 1e-300, 0.25, 1.0, 3.5, 1e6, f64::MAX, f64::INFINITY];
        for pair in loads.windows(2) {
            assert!(ordered_bits(pair[0]) < ordered_bits(pair[1]), "{pair:?}");
        }
        for zero in [-0.0, -1.0, f64::NAN, f64::NEG_INFINITY] {
            assert_eq!(ordered_bits(zero), 0, "{zero}");
        }
    }

    #[test]
    fn each_cpu_base_plus_its_own_counts_is_the_view() {
        let mut view = LoadView::new();
        let id = ServerId(3);
        view.set_load(id, LoadMetric::ActiveConnections, 5.0);
        view.set_load(id, LoadMetric::Packets, 120.5);
        let cpus = [
            ServerTraffic::default(),
            ServerTraffic {
                opened: 7,
                closed: 2,
                ..ServerTraffic::default()
            },
            ServerTraffic {
                opened: u64::MAX,
                moved_in: 3,
                closed: 1,
                ..ServerTraffic::default()
            },
        ];
        let values = published_loads(&view, id, &cpus);
        for (value, cpu) in values.iter().zip(&cpus) {
            let at_fold = value.active_base.wrapping_add(cpu.active_delta());
            assert_eq!(at_fold, 5);
            assert_eq!(value.packet_rate, 120.5f64.to_bits());
        }
    }
}
