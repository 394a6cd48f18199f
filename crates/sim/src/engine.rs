//! The discrete-event loop of one run: one scenario, one load balancer.
//!
//! Events are connection arrivals, departures, DIP updates (random and scheduled), LB
//! instance changes, the model's ticks and timers, and the metric window's boundaries.
//! Only departures live in a binary heap (sampled at arrival, so a connection's lifetime
//! never depends on the LB); every other kind has a single "next" time, and the loop takes
//! the earliest, ties broken in a fixed order. Nothing allocates per event: connections
//! live in a slab, per-server counts in dense vectors, and the load view the core's
//! policies read is updated in place.
//!
//! Determinism: the workload, the DIP updates and the policies draw from three generators
//! seeded from the scenario's seed, so every LB of a study sees exactly the same clients
//! and the same updates, and a run replays bit for bit.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use cheetah_core::policy::{LoadMetric, LoadView, PolicyRng};
use cheetah_core::{Nanos, ServerId};
use indicatif::ProgressBar;
use rand_core::SeedableRng;

use crate::conns::{Conn, ConnTable};
use crate::lbs::{LbModel, LbSpec, World};
use crate::metrics::{Imbalance, Recorder, Second};
use crate::scenario::{Action, Scenario, ScheduledChange};
use crate::workload::{below, exponential, secs, unit, Workload};

/// Independent generator streams of a run.
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    Workload = 1,
    Updates = 2,
    Policy = 3,
}

/// The seed of `stream` for a scenario seed (SplitMix64 of both), so that streams do not
/// overlap and adding a stream never shifts another.
pub fn stream_seed(seed: u64, stream: Stream) -> u64 {
    let mut z = seed
        .wrapping_add((stream as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One connection placement, recorded for tests that replay the core's policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub at: Nanos,
    /// When the connection ends on its own.
    pub until: Nanos,
    pub flow_hash: u64,
    pub server: ServerId,
    pub timestamps: bool,
}

/// Extras a caller may ask of a run.
#[derive(Default)]
pub struct RunOptions {
    pub record_placements: bool,
    /// Advanced in simulated seconds.
    pub progress: Option<ProgressBar>,
}

/// The outcome of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    pub lb: String,
    pub param: Option<f64>,
    /// Connections open at some instant of the window.
    pub connections: u64,
    pub broken: u64,
    pub bytes: u64,
    pub broken_bytes: u64,
    /// Connections without TCP timestamps (cheetah's fallback path) and those broken.
    pub fallback_connections: u64,
    pub fallback_broken: u64,
    /// Time-weighted average of max/average active connections over the pool.
    pub mean_system_imbalance: f64,
    pub mean_active: f64,
    pub arrivals: u64,
    pub dip_updates: u64,
    pub lb_changes: u64,
    pub events: u64,
    pub series: Vec<Second>,
    pub placements: Vec<Placement>,
}

impl RunResult {
    pub fn broken_pct(&self) -> f64 {
        pct(self.broken, self.connections)
    }

    pub fn broken_bytes_pct(&self) -> f64 {
        pct(self.broken_bytes, self.bytes)
    }

    pub fn imbalance_excess_pct(&self) -> f64 {
        (self.mean_system_imbalance - 1.0) * 100.0
    }
}

pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Event kinds in tie-breaking order: at equal times the earlier kind goes first (a
/// connection ending at `t` is not broken by an update at `t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    WindowOpens,
    SecondEnds,
    Departure,
    RandomUpdate,
    ScheduledUpdate,
    LbChange,
    Timer,
    Tick,
    Arrival,
}

/// Builds the model's view of the engine, borrowing fields one by one so that the
/// connection table can be lent mutably beside it.
macro_rules! world {
    ($engine:expr) => {
        World {
            now: $engine.now,
            pool: &$engine.pool,
            weights: &$engine.weights,
            active: &$engine.active,
            pool_active: $engine.imbalance.sum(),
            loads: &$engine.loads,
            lb_instances: &$engine.lb_instances,
        }
    };
}

struct Engine {
    now: Nanos,
    pool: Vec<ServerId>,
    weights: Vec<u32>,
    weight_pattern: Vec<u32>,
    in_pool: Vec<bool>,
    /// Servers out of the pool that random updates may bring back.
    removed: Vec<ServerId>,
    next_new_id: u16,
    min_pool: usize,
    active: Vec<u32>,
    loads: LoadView,
    imbalance: Imbalance,
    conns: ConnTable,
    departures: BinaryHeap<Reverse<(Nanos, u32, u32)>>,
    lb_instances: Vec<u8>,
    recorder: Recorder,
    broken: Vec<u32>,
    placements: Option<Vec<Placement>>,
    arrivals: u64,
    dip_updates: u64,
    lb_changes: u64,
}

impl Engine {
    #[inline]
    fn increment(&mut self, server: ServerId) {
        let count = &mut self.active[server.index()];
        if self.in_pool[server.index()] {
            self.imbalance.increment(*count);
        }
        *count += 1;
        self.loads
            .set_load(server, LoadMetric::ActiveConnections, f64::from(*count));
    }

    #[inline]
    fn decrement(&mut self, server: ServerId) {
        let count = &mut self.active[server.index()];
        if self.in_pool[server.index()] {
            self.imbalance.decrement(*count);
        }
        *count -= 1;
        self.loads
            .set_load(server, LoadMetric::ActiveConnections, f64::from(*count));
    }

    fn add_server(&mut self, server: ServerId) {
        let position = self
            .pool
            .binary_search(&server)
            .expect_err("server already in the pool");
        self.pool.insert(position, server);
        let weight = self.weight_pattern[server.index() % self.weight_pattern.len()];
        self.weights.insert(position, weight);
        self.in_pool[server.index()] = true;
        self.imbalance.add_server(self.active[server.index()]);
    }

    fn remove_server(&mut self, server: ServerId) {
        let position = self
            .pool
            .binary_search(&server)
            .expect("server in the pool");
        self.pool.remove(position);
        self.weights.remove(position);
        self.in_pool[server.index()] = false;
        self.imbalance.remove_server(self.active[server.index()]);
        self.removed.push(server);
    }

    fn place(
        &mut self,
        lb: &mut dyn LbModel,
        rng: &mut PolicyRng,
        mut conn: Conn,
        lifetime: Nanos,
    ) {
        let server = lb.place(&world!(self), rng, &mut conn);
        conn.server = server;
        if let Some(placements) = &mut self.placements {
            placements.push(Placement {
                at: self.now,
                until: self.now.saturating_add(lifetime),
                flow_hash: conn.flow_hash,
                server,
                timestamps: conn.timestamps,
            });
        }
        let slot = self.conns.insert(conn);
        let generation = self.conns.get(slot).generation();
        self.departures.push(Reverse((
            self.now.saturating_add(lifetime),
            slot,
            generation,
        )));
        self.increment(server);
    }

    /// Ends the connections the model reported broken.
    fn apply_broken(&mut self) {
        let broken = std::mem::take(&mut self.broken);
        for &slot in &broken {
            debug_assert!(self.conns.is_alive(slot), "slot {slot} reported twice");
            let conn = self.conns.remove(slot);
            self.decrement(conn.server);
            self.recorder.broken(self.now, conn.bytes, conn.timestamps);
        }
        self.broken = broken;
        self.broken.clear();
    }

    fn pool_changed(&mut self, lb: &mut dyn LbModel) {
        self.dip_updates += 1;
        lb.pool_changed(&world!(self), &mut self.conns, &mut self.broken);
        self.apply_broken();
    }
}

/// Runs `lb` over `scenario`.
pub fn run(
    scenario: &Scenario,
    lb_spec: &LbSpec,
    param: Option<f64>,
    options: &RunOptions,
) -> RunResult {
    let seed = scenario.seed;
    let mut workload = Workload::new(
        &scenario.workload,
        scenario.active_connections,
        PolicyRng::seed_from_u64(stream_seed(seed, Stream::Workload)),
    );
    let mut update_rng = PolicyRng::seed_from_u64(stream_seed(seed, Stream::Updates));
    let mut policy_rng = PolicyRng::seed_from_u64(stream_seed(seed, Stream::Policy));

    let servers = scenario.servers.max(1);
    let scheduled_adds = scenario
        .updates
        .scheduled
        .iter()
        .filter(|change| change.action == Action::Add)
        .count();
    let id_space = servers + scheduled_adds;
    let warmup = secs(scenario.warmup_s);
    let end = warmup + secs(scenario.duration_s);

    let mut engine = Engine {
        now: 0,
        pool: Vec::with_capacity(id_space),
        weights: Vec::with_capacity(id_space),
        weight_pattern: scenario.weights.clone(),
        in_pool: vec![false; id_space],
        removed: Vec::new(),
        next_new_id: servers as u16,
        min_pool: ((scenario.updates.min_pool_share * servers as f64).ceil() as usize).max(1),
        active: vec![0; id_space],
        loads: LoadView::new(),
        imbalance: Imbalance::default(),
        conns: ConnTable::with_capacity(workload.initial_active() * 5 / 4 + 16),
        departures: BinaryHeap::with_capacity(workload.initial_active() * 5 / 4 + 16),
        lb_instances: (0..scenario.lb_pool.instances.clamp(1, 64) as u8).collect(),
        recorder: Recorder::new(warmup, end, scenario.timeseries),
        broken: Vec::new(),
        placements: options.record_placements.then(Vec::new),
        arrivals: 0,
        dip_updates: 0,
        lb_changes: 0,
    };
    for id in 0..servers {
        engine.add_server(ServerId(id as u16));
    }
    engine.removed.clear();

    let mut lb = lb_spec.build(servers);
    let lb: &mut dyn LbModel = lb.as_mut();
    lb.start(&world!(engine));

    // Start in steady state: the connections a snapshot of the running system would find.
    for _ in 0..workload.initial_active() {
        let new = workload.connection_in_progress();
        let conn = Conn::new(new.flow_hash, new.bytes, new.timestamps, 0);
        engine.place(lb, &mut policy_rng, conn, new.lifetime);
    }

    let update_rate = scenario.updates.rate_per_min / 60.0;
    let mut next_random_update = if update_rate > 0.0 {
        secs(exponential(&mut update_rng, update_rate))
    } else {
        Nanos::MAX
    };
    let mut scheduled: Vec<ScheduledChange> = scenario.updates.scheduled.clone();
    scheduled.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let mut scheduled = scheduled.into_iter().peekable();
    let mut lb_changes: Vec<ScheduledChange> = scenario.lb_pool.changes.clone();
    lb_changes.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let mut lb_changes = lb_changes.into_iter().peekable();
    let tick_interval = lb.tick_interval();
    let mut next_tick = tick_interval.unwrap_or(Nanos::MAX);
    let mut next_arrival = workload.next_arrival(0);
    let mut window_open = false;
    let second = secs(1.0);
    let mut next_second = if scenario.timeseries {
        warmup + second
    } else {
        Nanos::MAX
    };
    let mut events: u64 = 0;

    loop {
        let candidates = [
            (
                if window_open { Nanos::MAX } else { warmup },
                Kind::WindowOpens,
            ),
            (next_second, Kind::SecondEnds),
            (
                engine
                    .departures
                    .peek()
                    .map_or(Nanos::MAX, |Reverse((at, _, _))| *at),
                Kind::Departure,
            ),
            (next_random_update, Kind::RandomUpdate),
            (
                scheduled.peek().map_or(Nanos::MAX, |c| secs(c.at_s)),
                Kind::ScheduledUpdate,
            ),
            (
                lb_changes.peek().map_or(Nanos::MAX, |c| secs(c.at_s)),
                Kind::LbChange,
            ),
            (lb.next_timer().unwrap_or(Nanos::MAX), Kind::Timer),
            (next_tick, Kind::Tick),
            (next_arrival, Kind::Arrival),
        ];
        let (at, kind) = candidates
            .into_iter()
            .min()
            .expect("candidates are not empty");
        if at > end || at == Nanos::MAX {
            engine.recorder.advance(end, &engine.imbalance);
            break;
        }
        engine.now = at;
        engine.recorder.advance(at, &engine.imbalance);
        events += 1;
        if events & 0xffff == 0 {
            if let Some(progress) = &options.progress {
                progress.set_position(at / secs(1.0));
            }
        }
        match kind {
            Kind::WindowOpens => {
                window_open = true;
                let (mut fallback, mut bytes) = (0, 0);
                for (_, conn) in engine.conns.iter() {
                    fallback += u64::from(!conn.timestamps);
                    bytes += conn.bytes;
                }
                engine
                    .recorder
                    .open(engine.conns.len() as u64, fallback, bytes);
            }
            Kind::SecondEnds => {
                engine
                    .recorder
                    .end_of_second(at, &engine.imbalance, engine.pool.len());
                next_second += second;
            }
            Kind::Departure => {
                let Reverse((_, slot, generation)) =
                    engine.departures.pop().expect("peeked a departure");
                if engine.conns.get_live(slot, generation).is_some() {
                    let conn = engine.conns.remove(slot);
                    engine.decrement(conn.server);
                    engine.recorder.completion(at);
                }
            }
            Kind::RandomUpdate => {
                let can_remove = engine.pool.len() > 1;
                let can_add = !engine.removed.is_empty();
                let remove = match (can_remove, can_add) {
                    (true, true) if engine.pool.len() > engine.min_pool => {
                        unit(&mut update_rng) < 0.5
                    }
                    (true, true) => false,
                    (can_remove, _) => can_remove,
                };
                if remove {
                    let victim = engine.pool[below(&mut update_rng, engine.pool.len())];
                    engine.remove_server(victim);
                    engine.pool_changed(lb);
                } else if can_add {
                    let index = below(&mut update_rng, engine.removed.len());
                    let back = engine.removed.swap_remove(index);
                    engine.add_server(back);
                    engine.pool_changed(lb);
                }
                next_random_update = at + secs(exponential(&mut update_rng, update_rate)).max(1);
            }
            Kind::ScheduledUpdate => {
                let change = scheduled.next().expect("peeked a change");
                match change.action {
                    Action::Add => {
                        let id = ServerId(engine.next_new_id);
                        engine.next_new_id += 1;
                        engine.add_server(id);
                        engine.pool_changed(lb);
                    }
                    Action::Remove if engine.pool.len() > 1 => {
                        let victim = engine.pool[below(&mut update_rng, engine.pool.len())];
                        engine.remove_server(victim);
                        engine.pool_changed(lb);
                    }
                    Action::Remove => {}
                }
            }
            Kind::LbChange => {
                let change = lb_changes.next().expect("peeked a change");
                let old = engine.lb_instances.clone();
                match change.action {
                    Action::Add => {
                        if let Some(id) = (0..64u8).find(|id| !engine.lb_instances.contains(id)) {
                            let position = engine.lb_instances.binary_search(&id).unwrap_err();
                            engine.lb_instances.insert(position, id);
                        }
                    }
                    Action::Remove => {
                        if engine.lb_instances.len() > 1 {
                            engine.lb_instances.remove(0);
                        }
                    }
                }
                if old != engine.lb_instances {
                    engine.lb_changes += 1;
                    lb.lb_instances_changed(
                        &world!(engine),
                        &old,
                        &mut engine.conns,
                        &mut engine.broken,
                    );
                    engine.apply_broken();
                }
            }
            Kind::Timer => {
                lb.timer(&world!(engine), &mut engine.conns, &mut engine.broken);
                engine.apply_broken();
            }
            Kind::Tick => {
                if lb.uses_reported_load() {
                    for &server in &engine.pool {
                        let active = f64::from(engine.active[server.index()]);
                        engine.loads.set_load(server, LoadMetric::Reported, active);
                    }
                }
                lb.tick(&world!(engine), &mut engine.conns, &mut engine.broken);
                engine.apply_broken();
                next_tick = at + tick_interval.expect("ticking model");
            }
            Kind::Arrival => {
                let new = workload.connection();
                engine.arrivals += 1;
                engine.recorder.arrival(at, new.bytes, new.timestamps);
                let conn = Conn::new(new.flow_hash, new.bytes, new.timestamps, at);
                engine.place(lb, &mut policy_rng, conn, new.lifetime);
                next_arrival = workload.next_arrival(at);
            }
        }
    }
    if let Some(progress) = &options.progress {
        progress.set_position(end / secs(1.0));
    }

    let recorder = &engine.recorder;
    RunResult {
        lb: lb_spec.name(),
        param,
        connections: recorder.connections,
        broken: recorder.broken,
        bytes: recorder.bytes,
        broken_bytes: recorder.broken_bytes,
        fallback_connections: recorder.fallback_connections,
        fallback_broken: recorder.fallback_broken,
        mean_system_imbalance: recorder.mean_system_imbalance(),
        mean_active: recorder.mean_active(),
        arrivals: engine.arrivals,
        dip_updates: engine.dip_updates,
        lb_changes: engine.lb_changes,
        events,
        series: engine.recorder.series.clone(),
        placements: engine.placements.take().unwrap_or_default(),
    }
}
