//! Per-server load metrics and how the workers of one LB process share them.
//!
//! Three layers, so that the per-packet path never touches an atomic:
//!
//! * [`SharedLoads`]: one per LB process (in an `Arc`), shared by every worker and by the
//!   control plane. It holds the process-wide totals per server id in atomics and takes the
//!   load reports servers send from outside.
//! * [`WorkerLoads`]: one per worker. The pipeline counts into it without synchronisation
//!   (new connections, server-side closes, packets and bytes). At least every
//!   [`MERGE_INTERVAL`] the worker [merges](WorkerLoads::merge): it pushes its deltas into
//!   the shared totals and pulls the totals back.
//! * [`LoadView`]: what a policy reads. A worker's view is the totals it pulled at its last
//!   merge plus its own deltas since then, so a worker sees its own picks immediately (least
//!   loaded would otherwise send every connection of a 10 ms interval to one server) and the
//!   other workers' picks within one merge interval.
//!
//! The active-connection count is an estimate (+1 when a policy picks the server for a new
//! connection, -1 when the server closes one: its first FIN, or an RST with a timestamp
//! option, once per connection; `lb/closes.rs` decides). Servers that report their real
//! count through [`SharedLoads::report`] replace the estimate, which bounds its drift.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::types::{boxed_array, Nanos, ServerId, NANOS_PER_MS, NANOS_PER_SEC};

/// How often a worker must fold its deltas into [`SharedLoads`] and refresh its view.
pub const MERGE_INTERVAL: Nanos = 10 * NANOS_PER_MS;

/// Time constant of the moving average behind the packet and byte rates.
///
/// Long enough to smooth the burstiness of one 10 ms merge interval, short enough that a
/// server which suddenly gets busy stops attracting new connections within a fraction of a
/// second.
pub const RATE_TIME_CONSTANT: Nanos = 100 * NANOS_PER_MS;

/// Which number a load-aware policy compares servers by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadMetric {
    /// Estimated open connections (SYN/FIN counting, reconciled by reports).
    ActiveConnections,
    /// Packets per second exchanged with the server (moving average).
    Packets,
    /// Bytes per second exchanged with the server (moving average).
    Bytes,
    /// The load the server reports from outside, e.g. its CPU utilisation.
    Reported,
}

/// A load report about one server, from an agent on the server or from the operator.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReportedLoad {
    /// The server's load in whatever unit the operator chose (CPU utilisation, queue
    /// length...); compared only with other servers' reports. `None` keeps the last value.
    pub load: Option<f64>,
    /// The number of connections the server really has open. It replaces the LB's SYN/FIN
    /// estimate, which drifts (lost FINs, connections that time out silently). `None`
    /// keeps the estimate.
    pub active_connections: Option<u64>,
}

/// A load report the LB refuses, so that one bad agent cannot poison the comparisons.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum InvalidReport {
    #[error("reported load {0} is not a finite, non-negative number")]
    Load(f64),
}

/// A consistent-enough reading of one server's process-wide load, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerLoad {
    pub active_connections: u64,
    /// Connections the policies placed on the server since its id was last reset.
    pub new_connections: u64,
    /// Packets exchanged with the server since its id was last reset (both directions).
    pub packets: u64,
    /// Bytes exchanged with the server since its id was last reset (both directions).
    pub bytes: u64,
    /// The last load the server reported (0 until it reports).
    pub reported_load: f64,
}

/// Process-wide load totals, indexed by server id. One per LB process, behind an `Arc`.
///
/// Every field is an independent statistic, so relaxed atomics suffice: nothing is
/// published through them.
pub struct SharedLoads {
    servers: Box<[SharedServerLoad]>,
}

#[derive(Default)]
struct SharedServerLoad {
    /// Never negative: merges clamp at 0 (see [`SharedLoads::add_active`]).
    active: AtomicI64,
    new_connections: AtomicU64,
    packets: AtomicU64,
    bytes: AtomicU64,
    /// `f64::to_bits` of the reported load.
    reported_load: AtomicU64,
}

impl SharedLoads {
    pub fn new() -> Self {
        let servers = (0..ServerId::SPACE)
            .map(|_| SharedServerLoad::default())
            .collect();
        SharedLoads { servers }
    }

    /// Records a report about `id`. The reported active-connection count replaces the
    /// estimate; workers pick it up at their next merge.
    pub fn report(&self, id: ServerId, report: ReportedLoad) -> Result<(), InvalidReport> {
        if let Some(load) = report.load {
            if !load.is_finite() || load < 0.0 {
                return Err(InvalidReport::Load(load));
            }
        }
        let server = &self.servers[id.index()];
        if let Some(load) = report.load {
            server
                .reported_load
                .store(load.to_bits(), Ordering::Relaxed);
        }
        if let Some(active) = report.active_connections {
            let active = i64::try_from(active).unwrap_or(i64::MAX);
            server.active.store(active, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Reads the totals of `id`.
    pub fn server(&self, id: ServerId) -> ServerLoad {
        let server = &self.servers[id.index()];
        ServerLoad {
            active_connections: server.active.load(Ordering::Relaxed).max(0) as u64,
            new_connections: server.new_connections.load(Ordering::Relaxed),
            packets: server.packets.load(Ordering::Relaxed),
            bytes: server.bytes.load(Ordering::Relaxed),
            reported_load: f64::from_bits(server.reported_load.load(Ordering::Relaxed)),
        }
    }

    /// Forgets everything about `id`, for when the id is retired and may later name another
    /// server. Deltas a worker has not merged yet still land afterwards; retire an id only
    /// once no connection can carry it any more.
    pub fn reset(&self, id: ServerId) {
        let server = &self.servers[id.index()];
        server.active.store(0, Ordering::Relaxed);
        server.new_connections.store(0, Ordering::Relaxed);
        server.packets.store(0, Ordering::Relaxed);
        server.bytes.store(0, Ordering::Relaxed);
        server
            .reported_load
            .store(0f64.to_bits(), Ordering::Relaxed);
    }

    /// Adds traffic no worker saw (the XDP program's fast path forwards packets in the
    /// kernel) to the totals of `id`. The policies see it from every worker's next merge
    /// on, like any other worker's deltas.
    pub fn add_traffic(&self, id: ServerId, packets: u64, bytes: u64) {
        let delta = PendingDelta {
            packets,
            bytes,
            ..PendingDelta::default()
        };
        self.add(id, &delta);
    }

    /// Adds what the XDP program's in-kernel path counted for `id` since the last call:
    /// `opened` connections it placed there (each as a policy's pick: +1 active, +1 new
    /// connection), `moved_in` counts a SYN-ACK moved there (the `to` of
    /// [`WorkerLoads::on_connection_moved`]: +1 active) and `closed` counts it released
    /// (each as a counted close, a retransmitted SYN's earlier pick or a moved count's
    /// `from`: -1 active), clamped as any worker's merge is.
    pub fn add_kernel_counts(&self, id: ServerId, opened: u64, moved_in: u64, closed: u64) {
        let delta = PendingDelta {
            active: opened.wrapping_add(moved_in).wrapping_sub(closed) as i64,
            new_connections: opened,
            ..PendingDelta::default()
        };
        self.add(id, &delta);
    }

    /// Adds one worker's deltas to the totals of `id`.
    fn add(&self, id: ServerId, delta: &PendingDelta) {
        let server = &self.servers[id.index()];
        if delta.active != 0 {
            Self::add_active(&server.active, delta.active);
        }
        if delta.new_connections != 0 {
            server
                .new_connections
                .fetch_add(delta.new_connections, Ordering::Relaxed);
        }
        if delta.packets != 0 {
            server.packets.fetch_add(delta.packets, Ordering::Relaxed);
        }
        if delta.bytes != 0 {
            server.bytes.fetch_add(delta.bytes, Ordering::Relaxed);
        }
    }

    /// Adds `delta` to an active count, clamping at 0.
    ///
    /// Closes can outnumber opens: a close the pipeline's filter forgot may count twice
    /// (`lb/closes.rs`), and a report may have lowered the estimate since the connection
    /// was counted. Without
    /// the clamp such errors would accumulate into a negative count that makes the server
    /// look idle forever. The price is that a close merged (by one worker) before its open
    /// (merged by another) leaves the count one too high until the next report.
    fn add_active(active: &AtomicI64, delta: i64) {
        let _ = active.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
            Some(current.saturating_add(delta).max(0))
        });
    }
}

impl Default for SharedLoads {
    fn default() -> Self {
        Self::new()
    }
}

/// The loads one worker's policies see, indexed by server id.
///
/// A worker's view comes from [`WorkerLoads::view`]. Simulators and tests can also build one
/// with [`LoadView::new`] and set the loads directly with [`LoadView::set_load`].
#[derive(Clone)]
pub struct LoadView {
    servers: Box<[ViewedServer; ServerId::SPACE]>,
}

#[derive(Clone, Copy, Debug, Default)]
struct ViewedServer {
    /// Pulled total plus own unmerged delta; may dip below 0 in between merges.
    active: i64,
    packets: u64,
    bytes: u64,
    reported_load: f64,
    packet_rate: f64,
    byte_rate: f64,
}

impl LoadView {
    /// A view in which every server is idle.
    pub fn new() -> Self {
        LoadView {
            servers: boxed_array(ViewedServer::default()),
        }
    }

    /// The load of `id` under `metric`; higher means busier.
    #[inline]
    pub fn load(&self, id: ServerId, metric: LoadMetric) -> f64 {
        let server = &self.servers[id.index()];
        match metric {
            LoadMetric::ActiveConnections => server.active.max(0) as f64,
            LoadMetric::Packets => server.packet_rate,
            LoadMetric::Bytes => server.byte_rate,
            LoadMetric::Reported => server.reported_load,
        }
    }

    #[inline]
    pub fn active_connections(&self, id: ServerId) -> u64 {
        self.servers[id.index()].active.max(0) as u64
    }

    /// Packets exchanged with `id`: the process-wide total at the last merge (this worker's
    /// own packets included from its next merge on).
    #[inline]
    pub fn packets(&self, id: ServerId) -> u64 {
        self.servers[id.index()].packets
    }

    /// Bytes exchanged with `id`, counted like [`LoadView::packets`].
    #[inline]
    pub fn bytes(&self, id: ServerId) -> u64 {
        self.servers[id.index()].bytes
    }

    #[inline]
    pub fn reported_load(&self, id: ServerId) -> f64 {
        self.servers[id.index()].reported_load
    }

    /// Overrides what [`LoadView::load`] returns for `id` under `metric` (until the next
    /// merge, for a worker's view). For simulators and tests that model load themselves.
    pub fn set_load(&mut self, id: ServerId, metric: LoadMetric, value: f64) {
        let server = &mut self.servers[id.index()];
        match metric {
            LoadMetric::ActiveConnections => server.active = value.round() as i64,
            LoadMetric::Packets => server.packet_rate = value,
            LoadMetric::Bytes => server.byte_rate = value,
            LoadMetric::Reported => server.reported_load = value,
        }
    }

    /// Replaces the totals of `id` by the process-wide ones (rates are left alone).
    fn pull(&mut self, id: ServerId, totals: &ServerLoad) {
        let server = &mut self.servers[id.index()];
        server.active = totals.active_connections as i64;
        server.packets = totals.packets;
        server.bytes = totals.bytes;
        server.reported_load = totals.reported_load;
    }
}

impl Default for LoadView {
    fn default() -> Self {
        Self::new()
    }
}

/// One worker's load counters: written per packet without synchronisation, merged into
/// [`SharedLoads`] every [`MERGE_INTERVAL`].
///
/// The worker tells it which ids to keep fresh with [`WorkerLoads::watch`] (the union of
/// its VIPs' pools, given again whenever a new pool snapshot is published). A merge then
/// costs O(ids touched since the last merge + watched ids), independent of the 32768-id
/// space. Ids that are neither watched nor touched keep whatever the view last saw.
pub struct WorkerLoads {
    shared: Arc<SharedLoads>,
    view: LoadView,
    /// Unmerged deltas, indexed by server id.
    pending: Box<[PendingDelta; ServerId::SPACE]>,
    /// Ids with a pending delta, each once. Allocated for the whole id space, so pushing
    /// never reallocates on the per-packet path.
    dirty: Vec<ServerId>,
    watched: Vec<WatchedServer>,
    last_merge: Option<Nanos>,
    /// `last_merge + MERGE_INTERVAL` (0 before the first merge), so that the per-packet
    /// check is one compare.
    next_merge: Nanos,
}

#[derive(Clone, Copy, Default)]
struct PendingDelta {
    active: i64,
    new_connections: u64,
    packets: u64,
    bytes: u64,
    /// Already listed in `dirty`.
    dirty: bool,
}

/// A watched id and the totals its rates were last computed from.
#[derive(Clone, Copy)]
struct WatchedServer {
    id: ServerId,
    packets: u64,
    bytes: u64,
}

impl WorkerLoads {
    pub fn new(shared: Arc<SharedLoads>) -> Self {
        WorkerLoads {
            shared,
            view: LoadView::new(),
            pending: boxed_array(PendingDelta::default()),
            dirty: Vec::with_capacity(ServerId::SPACE),
            watched: Vec::new(),
            last_merge: None,
            next_merge: 0,
        }
    }

    pub fn shared(&self) -> &Arc<SharedLoads> {
        &self.shared
    }

    /// Replaces the set of ids whose totals every merge refreshes, and refreshes them now,
    /// so that a server that just joined a pool is not mistaken for an idle one until the
    /// next merge. Ids already watched keep their rates.
    pub fn watch(&mut self, ids: &[ServerId]) {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut watched = Vec::with_capacity(ids.len());
        for id in ids {
            let totals = self.shared.server(id);
            // `self.watched` is sorted by id, like `ids`.
            match self.watched.binary_search_by_key(&id, |w| w.id) {
                Ok(at) => watched.push(self.watched[at]),
                Err(_) => {
                    let (packets, bytes) = (totals.packets, totals.bytes);
                    watched.push(WatchedServer { id, packets, bytes });
                    self.view.set_load(id, LoadMetric::Packets, 0.0);
                    self.view.set_load(id, LoadMetric::Bytes, 0.0);
                }
            }
            self.view.pull(id, &totals);
            let (viewed, pending) = (
                &mut self.view.servers[id.index()],
                &self.pending[id.index()],
            );
            viewed.active += pending.active;
            viewed.packets += pending.packets;
            viewed.bytes += pending.bytes;
        }
        self.watched = watched;
    }

    /// A policy picked `id` for a new connection.
    #[inline]
    pub fn on_new_connection(&mut self, id: ServerId) {
        let pending = self.pending_mut(id);
        pending.active += 1;
        pending.new_connections += 1;
        self.view.servers[id.index()].active += 1;
    }

    /// Server `id` closed a connection. Only the server's closes count, and only one per
    /// connection (`lb/closes.rs`): a client could otherwise steer the load-aware policies
    /// toward a server with RSTs for connections it never opened, with replayed segments
    /// that draw RSTs from the server, or by never acknowledging the server's FIN.
    ///
    /// The pipeline calls this out of line, from the one function both server paths send
    /// their FIN and RST segments to: every other reply pays one test of its flags, and
    /// only FIN and RST segments touch the shared filter. (The count was once lowered by
    /// `closes as i64` without a branch; a close that must consult a shared filter has no
    /// such form.)
    #[inline]
    pub fn on_server_close(&mut self, id: ServerId) {
        self.pending_mut(id).active -= 1;
        self.view.servers[id.index()].active -= 1;
    }

    /// The client retransmitted a SYN first given to `id`, which the policy has placed again
    /// (and counted) elsewhere or on `id` once more: `id`'s earlier count goes.
    #[inline]
    pub fn on_syn_retransmitted(&mut self, id: ServerId) {
        self.pending_mut(id).active -= 1;
        self.view.servers[id.index()].active -= 1;
    }

    /// A connection counted on `from` was answered first by `to` (after a retried SYN), so
    /// it will be `to`'s: the count moves. New-connection totals are left alone.
    #[inline]
    pub fn on_connection_moved(&mut self, from: ServerId, to: ServerId) {
        self.on_syn_retransmitted(from);
        self.pending_mut(to).active += 1;
        self.view.servers[to.index()].active += 1;
    }

    /// A packet of `bytes` bytes went to or came from `id`.
    #[inline(always)]
    pub fn on_packet(&mut self, id: ServerId, bytes: usize) {
        let bytes = bytes as u64;
        let pending = self.pending_mut(id);
        pending.packets += 1;
        pending.bytes += bytes;
        // The view's packet and byte totals move at merges only: the policies use rates
        // computed at merges, and this keeps a second cache line off the per-packet path.
    }

    #[inline(always)]
    fn pending_mut(&mut self, id: ServerId) -> &mut PendingDelta {
        let pending = &mut self.pending[id.index()];
        if !pending.dirty {
            pending.dirty = true;
            self.dirty.push(id);
        }
        pending
    }

    /// Whether [`MERGE_INTERVAL`] has passed since the last merge (or there was none).
    #[inline(always)]
    pub fn merge_due(&self, now: Nanos) -> bool {
        now >= self.next_merge
    }

    /// Pushes this worker's deltas into the shared totals, then makes the view the fresh
    /// totals of every touched or watched id and updates the watched ids' rates.
    pub fn merge(&mut self, now: Nanos) {
        for &id in &self.dirty {
            let pending = &mut self.pending[id.index()];
            self.shared.add(id, pending);
            *pending = PendingDelta::default();
            self.view.pull(id, &self.shared.server(id));
        }
        self.dirty.clear();

        let elapsed = self.last_merge.map_or(0, |last| now.saturating_sub(last));
        let smoothing = if elapsed == 0 {
            0.0
        } else {
            1.0 - (-(elapsed as f64) / RATE_TIME_CONSTANT as f64).exp()
        };
        let seconds = elapsed as f64 / NANOS_PER_SEC as f64;
        for watched in &mut self.watched {
            let totals = self.shared.server(watched.id);
            let viewed = &mut self.view.servers[watched.id.index()];
            if elapsed > 0 {
                // A reset id's totals go back to 0: count that interval as idle.
                let packets = totals.packets.saturating_sub(watched.packets) as f64;
                let bytes = totals.bytes.saturating_sub(watched.bytes) as f64;
                viewed.packet_rate += (packets / seconds - viewed.packet_rate) * smoothing;
                viewed.byte_rate += (bytes / seconds - viewed.byte_rate) * smoothing;
                watched.packets = totals.packets;
                watched.bytes = totals.bytes;
            }
            self.view.pull(watched.id, &totals);
        }
        self.last_merge = Some(now);
        // Saturating: 584 years in, the next merge would be due at u64::MAX ns.
        self.next_merge = now.saturating_add(MERGE_INTERVAL);
    }

    /// The loads this worker's policies see: the totals at the last merge plus this
    /// worker's own deltas since.
    #[inline]
    pub fn view(&self) -> &LoadView {
        &self.view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ServerId = ServerId(1);
    const B: ServerId = ServerId(2);

    fn two_workers() -> (Arc<SharedLoads>, WorkerLoads, WorkerLoads) {
        let shared = Arc::new(SharedLoads::new());
        let mut first = WorkerLoads::new(shared.clone());
        let mut second = WorkerLoads::new(shared.clone());
        first.watch(&[A, B]);
        second.watch(&[A, B]);
        (shared, first, second)
    }

    #[test]
    fn metric_names_are_kebab_case() {
        #[derive(Deserialize)]
        struct Config {
            metric: LoadMetric,
        }
        for (name, metric) in [
            ("active-connections", LoadMetric::ActiveConnections),
            ("packets", LoadMetric::Packets),
            ("bytes", LoadMetric::Bytes),
            ("reported", LoadMetric::Reported),
        ] {
            let config: Config = toml::from_str(&format!("metric = \"{name}\"")).unwrap();
            assert_eq!(config.metric, metric);
        }
    }

    #[test]
    fn own_picks_show_in_the_view_before_any_merge() {
        let (shared, mut first, _) = two_workers();
        first.on_new_connection(A);
        first.on_new_connection(A);
        assert_eq!(first.view().active_connections(A), 2);
        assert_eq!(first.view().load(A, LoadMetric::ActiveConnections), 2.0);
        assert_eq!(shared.server(A).active_connections, 0, "not merged yet");
    }

    #[test]
    fn both_workers_see_the_sum_after_merging() {
        let (shared, mut first, mut second) = two_workers();
        first.on_new_connection(A);
        first.on_new_connection(B);
        second.on_new_connection(A);
        second.on_packet(B, 1500);
        first.merge(MERGE_INTERVAL);
        second.merge(MERGE_INTERVAL);
        first.merge(2 * MERGE_INTERVAL);
        for view in [first.view(), second.view()] {
            assert_eq!(view.active_connections(A), 2);
            assert_eq!(view.active_connections(B), 1);
            assert_eq!(view.packets(B), 1);
            assert_eq!(view.bytes(B), 1500);
        }
        assert_eq!(shared.server(A).active_connections, 2);
    }

    #[test]
    fn server_packets_count_as_packets_and_closes_lower_the_count() {
        let (shared, mut first, mut second) = two_workers();
        for _ in 0..3 {
            first.on_new_connection(A);
        }
        first.on_packet(A, 1500);
        first.on_packet(A, 60);
        first.on_server_close(A);
        second.on_packet(A, 60);
        second.on_server_close(A);
        assert_eq!(first.view().active_connections(A), 2);
        first.merge(MERGE_INTERVAL);
        second.merge(MERGE_INTERVAL);
        let load = shared.server(A);
        assert_eq!(load.active_connections, 1);
        assert_eq!(load.new_connections, 3);
        first.merge(2 * MERGE_INTERVAL);
        assert_eq!(first.view().packets(A), 3);
        assert_eq!(first.view().bytes(A), 1620);
    }

    #[test]
    fn a_view_is_pulled_totals_plus_own_unmerged_deltas() {
        let (_, mut first, mut second) = two_workers();
        second.on_new_connection(A);
        second.merge(MERGE_INTERVAL);
        first.merge(MERGE_INTERVAL);
        first.on_new_connection(A);
        second.on_new_connection(A);
        assert_eq!(first.view().active_connections(A), 2);
        assert_eq!(second.view().active_connections(A), 2);
    }

    #[test]
    fn kernel_counts_add_as_a_workers_picks_and_closes_do() {
        let (shared, mut first, _) = two_workers();
        shared.add_kernel_counts(A, 3, 0, 1);
        first.merge(MERGE_INTERVAL);
        assert_eq!(first.view().active_connections(A), 2);
        assert_eq!(shared.server(A).new_connections, 3);
        // More released than opened: clamped at 0, as a worker's extra closes are.
        shared.add_kernel_counts(A, 0, 0, 5);
        assert_eq!(shared.server(A).active_connections, 0);
        // A count moved in: one more active, no new connection.
        shared.add_kernel_counts(A, 0, 1, 0);
        assert_eq!(shared.server(A).active_connections, 1);
        assert_eq!(shared.server(A).new_connections, 3);
    }

    #[test]
    fn extra_closes_clamp_at_zero() {
        let (shared, mut first, mut second) = two_workers();
        first.on_new_connection(A);
        first.on_packet(A, 60);
        first.on_server_close(A);
        first.on_packet(A, 60);
        first.on_server_close(A);
        assert_eq!(first.view().active_connections(A), 0);
        first.merge(MERGE_INTERVAL);
        assert_eq!(shared.server(A).active_connections, 0);
        // The clamp happened in the shared value: a later open counts from 0, not -1.
        second.on_new_connection(A);
        second.merge(MERGE_INTERVAL);
        assert_eq!(shared.server(A).active_connections, 1);
        assert_eq!(second.view().active_connections(A), 1);
    }

    #[test]
    fn a_retried_syn_and_a_moved_count_keep_one_count_per_connection() {
        let (shared, mut first, mut second) = two_workers();
        first.on_new_connection(A);
        // The retransmitted SYN reaches the other worker, which places it on B.
        second.on_new_connection(B);
        second.on_syn_retransmitted(A);
        first.merge(MERGE_INTERVAL);
        second.merge(MERGE_INTERVAL);
        assert_eq!(shared.server(A).active_connections, 0);
        assert_eq!(shared.server(B).active_connections, 1);
        first.merge(2 * MERGE_INTERVAL);
        // A's late SYN-ACK reached the client first after all: the count follows it.
        first.on_connection_moved(B, A);
        assert_eq!(first.view().active_connections(A), 1);
        assert_eq!(first.view().active_connections(B), 0);
        first.merge(3 * MERGE_INTERVAL);
        assert_eq!(shared.server(A).active_connections, 1);
        assert_eq!(shared.server(B).active_connections, 0);
        assert_eq!(
            shared.server(A).new_connections,
            1,
            "a move is not a new connection"
        );
    }

    #[test]
    fn reported_active_count_replaces_the_estimate() {
        let (shared, mut first, _) = two_workers();
        for _ in 0..5 {
            first.on_new_connection(A);
        }
        first.merge(MERGE_INTERVAL);
        let report = ReportedLoad {
            load: Some(0.75),
            active_connections: Some(2),
        };
        shared.report(A, report).unwrap();
        assert_eq!(shared.server(A).active_connections, 2);
        first.merge(2 * MERGE_INTERVAL);
        assert_eq!(first.view().active_connections(A), 2);
        assert_eq!(first.view().load(A, LoadMetric::Reported), 0.75);
    }

    #[test]
    fn a_report_without_a_count_keeps_the_estimate() {
        let (shared, mut first, _) = two_workers();
        first.on_new_connection(A);
        first.merge(MERGE_INTERVAL);
        shared
            .report(
                A,
                ReportedLoad {
                    load: Some(0.5),
                    active_connections: None,
                },
            )
            .unwrap();
        shared.report(A, ReportedLoad::default()).unwrap();
        assert_eq!(shared.server(A).active_connections, 1);
        assert_eq!(shared.server(A).reported_load, 0.5);
    }

    #[test]
    fn malformed_reported_loads_are_refused() {
        let shared = SharedLoads::new();
        for bad in [f64::NAN, f64::INFINITY, -0.5] {
            let report = ReportedLoad {
                load: Some(bad),
                active_connections: Some(9),
            };
            assert!(shared.report(A, report).is_err(), "{bad}");
        }
        assert_eq!(
            shared.server(A),
            ServerLoad::default(),
            "a refused report changes nothing"
        );
    }

    #[test]
    fn retransmitted_syn_to_two_servers_nets_to_zero() {
        // The first SYN went to A; its retransmission (the SYN-ACK was lost) was picked
        // anew and went to B. A answers the stray connection with an RST, B later closes
        // the real one with a FIN.
        let (shared, mut first, mut second) = two_workers();
        first.on_new_connection(A);
        first.on_new_connection(B);
        first.merge(MERGE_INTERVAL);
        second.on_packet(A, 60);
        second.on_server_close(A);
        second.merge(MERGE_INTERVAL);
        first.on_packet(B, 60);
        first.on_server_close(B);
        first.merge(2 * MERGE_INTERVAL);
        second.merge(2 * MERGE_INTERVAL);
        for id in [A, B] {
            assert_eq!(shared.server(id).active_connections, 0);
            assert_eq!(first.view().active_connections(id), 0);
            assert_eq!(second.view().active_connections(id), 0);
        }
    }

    #[test]
    fn merges_are_due_every_interval() {
        let (_, mut first, _) = two_workers();
        assert!(first.merge_due(0), "the first merge is due at once");
        first.merge(5 * NANOS_PER_MS);
        assert!(!first.merge_due(5 * NANOS_PER_MS + MERGE_INTERVAL - 1));
        assert!(first.merge_due(5 * NANOS_PER_MS + MERGE_INTERVAL));
    }

    #[test]
    fn packet_rate_tracks_steady_traffic() {
        let (_, mut first, _) = two_workers();
        first.merge(0);
        // 100 packets of 1000 bytes every 10 ms: 10_000 packets/s, 10 MB/s.
        for interval in 1..=200 {
            for _ in 0..100 {
                first.on_packet(A, 1000);
            }
            first.merge(interval * MERGE_INTERVAL);
        }
        let view = first.view();
        assert!((view.load(A, LoadMetric::Packets) - 10_000.0).abs() < 1.0);
        assert!((view.load(A, LoadMetric::Bytes) - 10_000_000.0).abs() < 1000.0);
        assert_eq!(view.load(B, LoadMetric::Packets), 0.0);
        assert_eq!(view.packets(A), 20_000);
    }

    #[test]
    fn traffic_no_worker_saw_moves_the_rates_of_every_worker() {
        let (shared, mut first, mut second) = two_workers();
        first.merge(0);
        second.merge(0);
        // The kernel forwarded 10_000 packets of 100 bytes to A in each 100 ms interval.
        for interval in 1..=100 {
            shared.add_traffic(A, 10_000, 1_000_000);
            first.merge(interval * 10 * MERGE_INTERVAL);
            second.merge(interval * 10 * MERGE_INTERVAL);
        }
        for worker in [&first, &second] {
            let view = worker.view();
            assert!((view.load(A, LoadMetric::Packets) - 100_000.0).abs() < 10.0);
            assert!((view.load(A, LoadMetric::Bytes) - 10_000_000.0).abs() < 1000.0);
            assert_eq!(view.load(B, LoadMetric::Packets), 0.0);
        }
        assert_eq!(shared.server(A).packets, 1_000_000);
    }

    #[test]
    fn watching_a_server_pulls_its_totals_at_once() {
        let (shared, mut first, _) = two_workers();
        let late = ServerId(7);
        let report = ReportedLoad {
            load: None,
            active_connections: Some(40),
        };
        shared.report(late, report).unwrap();
        first.on_new_connection(late);
        first.watch(&[A, B, late]);
        assert_eq!(first.view().active_connections(late), 41);
    }

    #[test]
    fn new_connections_add_up_across_workers_and_closes_do_not_lower_them() {
        let shared = Arc::new(SharedLoads::new());
        let mut a = WorkerLoads::new(Arc::clone(&shared));
        let mut b = WorkerLoads::new(Arc::clone(&shared));
        let id = ServerId(4);
        for _ in 0..3 {
            a.on_new_connection(id);
        }
        b.on_new_connection(id);
        b.on_packet(id, 60);
        b.on_server_close(id);
        a.merge(NANOS_PER_SEC);
        b.merge(NANOS_PER_SEC);
        let load = shared.server(id);
        assert_eq!(load.new_connections, 4);
        assert_eq!(load.active_connections, 3);
        shared.reset(id);
        assert_eq!(shared.server(id).new_connections, 0);
    }

    #[test]
    fn reset_forgets_a_retired_id() {
        let (shared, mut first, _) = two_workers();
        first.on_new_connection(A);
        first.on_packet(A, 60);
        first.merge(MERGE_INTERVAL);
        shared
            .report(
                A,
                ReportedLoad {
                    load: Some(3.0),
                    active_connections: None,
                },
            )
            .unwrap();
        shared.reset(A);
        assert_eq!(shared.server(A), ServerLoad::default());
        first.merge(2 * MERGE_INTERVAL);
        assert_eq!(first.view().active_connections(A), 0);
        assert_eq!(first.view().packets(A), 0);
    }

    #[test]
    fn set_load_overrides_the_metric() {
        let mut view = LoadView::new();
        view.set_load(A, LoadMetric::Reported, 0.3);
        view.set_load(A, LoadMetric::ActiveConnections, 12.0);
        assert_eq!(view.load(A, LoadMetric::Reported), 0.3);
        assert_eq!(view.load(A, LoadMetric::ActiveConnections), 12.0);
        assert_eq!(view.load(B, LoadMetric::Reported), 0.0);
    }
}
