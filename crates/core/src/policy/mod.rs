//! Load-balancing policies: how the first packet of a connection picks a server.
//!
//! Every policy is its own module behind the [`Policy`] trait. A policy instance is
//! per worker (it may keep a cursor or smooth-WRR credits) and is rebuilt from the VIP's
//! immutable [`PoolSnapshot`] whenever the control plane publishes a new snapshot. Heavy
//! immutable state (the Maglev lookup table) is built once per snapshot and shared.
//!
//! Policies never read the clock or the OS RNG: the caller passes `now` and a seeded
//! [`PolicyRng`], so a run replays exactly.

pub mod awrr;
pub mod hash;
pub mod least_loaded;
pub mod load;
pub mod maglev;
pub mod pow2;
pub mod random;
pub mod rr;
pub mod schedule;
pub mod wrr;

#[cfg(test)]
mod testing;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::names::{find_by_name, UnknownName};
use crate::types::{Nanos, ServerId};
pub use load::{LoadMetric, LoadView, ReportedLoad, SharedLoads, WorkerLoads, MERGE_INTERVAL};
pub use maglev::MaglevTable;

/// The seeded generator every randomized policy draws from.
pub type PolicyRng = rand_xoshiro::Xoshiro256PlusPlus;

/// Which policy a VIP uses for new connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// `pool[h % n]` on the keyed connection hash.
    Hash,
    /// Maglev consistent hashing.
    Maglev,
    #[serde(rename = "rr")]
    RoundRobin,
    /// Smooth (interleaved) weighted round-robin on configured weights.
    #[serde(rename = "wrr")]
    WeightedRoundRobin,
    /// Automatic WRR whose weights follow load (paper section 4.1).
    #[serde(rename = "awrr")]
    AutoWeightedRoundRobin,
    #[serde(rename = "pow2")]
    PowerOfTwo,
    LeastLoaded,
    Random,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 8] = [
        PolicyKind::Hash,
        PolicyKind::Maglev,
        PolicyKind::RoundRobin,
        PolicyKind::WeightedRoundRobin,
        PolicyKind::AutoWeightedRoundRobin,
        PolicyKind::PowerOfTwo,
        PolicyKind::LeastLoaded,
        PolicyKind::Random,
    ];

    /// The name in the config file, the control API, on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Hash => "hash",
            PolicyKind::Maglev => "maglev",
            PolicyKind::RoundRobin => "rr",
            PolicyKind::WeightedRoundRobin => "wrr",
            PolicyKind::AutoWeightedRoundRobin => "awrr",
            PolicyKind::PowerOfTwo => "pow2",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::Random => "random",
        }
    }

    /// The load metric a load-aware policy uses unless the VIP says otherwise.
    pub fn default_metric(self) -> LoadMetric {
        match self {
            PolicyKind::AutoWeightedRoundRobin => LoadMetric::Reported,
            _ => LoadMetric::ActiveConnections,
        }
    }
}

impl FromStr for PolicyKind {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        find_by_name("policy", name, &PolicyKind::ALL, PolicyKind::name)
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a policy may pick from: the servers of one VIP that accept new connections.
///
/// Built by the control plane, immutable, shared by all workers.
#[derive(Debug)]
pub struct PoolSnapshot {
    /// Servers that take new connections (draining and removed servers are excluded).
    pub servers: Vec<ServerId>,
    /// Configured weight of each entry of `servers` (same length, each >= 1).
    pub weights: Vec<u32>,
    /// Maglev table over `servers`; also used by the no-timestamp fallback.
    pub maglev: Arc<MaglevTable>,
    /// Load metric for load-aware policies.
    pub metric: LoadMetric,
}

impl PoolSnapshot {
    /// A pool whose Maglev table has `maglev_size` slots (the LB's `maglev_table_size`).
    pub fn new(
        servers: Vec<ServerId>,
        weights: Vec<u32>,
        metric: LoadMetric,
        maglev_size: usize,
    ) -> Self {
        assert_eq!(servers.len(), weights.len(), "one weight per server");
        let maglev = Arc::new(MaglevTable::build(&servers, maglev_size));
        PoolSnapshot {
            servers,
            weights,
            maglev,
            metric,
        }
    }
}

/// Everything a policy may look at to pick a server for one new connection.
pub struct PickContext<'a> {
    pub pool: &'a PoolSnapshot,
    /// Keyed hash of the canonical connection id.
    pub flow_hash: u64,
    pub loads: &'a LoadView,
    pub rng: &'a mut PolicyRng,
    pub now: Nanos,
}

/// A load-balancing policy instance owned by one worker.
pub trait Policy: Send {
    fn kind(&self) -> PolicyKind;

    /// Picks the server for a new connection. Returns `None` only for an empty pool.
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId>;

    /// Called after the worker merged load counters (at least every 10 ms), so policies
    /// whose state derives from load (AWRR buckets) can refresh it off the per-packet path.
    fn on_loads_merged(&mut self, _pool: &PoolSnapshot, _loads: &LoadView) {}
}

/// Builds the per-worker instance of `kind` for `pool`.
///
/// `worker` and `workers` let stateful policies start their cursors apart, so that two
/// workers do not both send their first connection to the same server.
pub fn build(
    kind: PolicyKind,
    pool: &PoolSnapshot,
    worker: usize,
    workers: usize,
) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Hash => Box::new(hash::HashPolicy),
        PolicyKind::Maglev => Box::new(maglev::MaglevPolicy),
        PolicyKind::RoundRobin => Box::new(rr::RoundRobin::new(pool, worker, workers)),
        PolicyKind::WeightedRoundRobin => {
            Box::new(wrr::WeightedRoundRobin::new(pool, worker, workers))
        }
        PolicyKind::AutoWeightedRoundRobin => {
            Box::new(awrr::AutoWeightedRoundRobin::new(pool, worker, workers))
        }
        PolicyKind::PowerOfTwo => Box::new(pow2::PowerOfTwo),
        PolicyKind::LeastLoaded => Box::new(least_loaded::LeastLoaded::new(worker)),
        PolicyKind::Random => Box::new(random::Random),
    }
}

#[cfg(test)]
mod tests {
    use rand_core::SeedableRng;

    use super::*;

    fn pick_once(kind: PolicyKind, pool: &PoolSnapshot) -> Option<ServerId> {
        let loads = LoadView::new();
        let mut rng = PolicyRng::seed_from_u64(0);
        let mut ctx = PickContext {
            pool,
            flow_hash: 12_345,
            loads: &loads,
            rng: &mut rng,
            now: 0,
        };
        let mut policy = build(kind, pool, 3, 4);
        assert_eq!(policy.kind(), kind);
        policy.on_loads_merged(pool, &loads);
        policy.pick(&mut ctx)
    }

    #[test]
    fn every_policy_picks_nothing_from_an_empty_pool() {
        let empty = PoolSnapshot::new(
            Vec::new(),
            Vec::new(),
            LoadMetric::ActiveConnections,
            maglev::DEFAULT_TABLE_SIZE,
        );
        for kind in PolicyKind::ALL {
            assert_eq!(pick_once(kind, &empty), None, "{}", kind.name());
        }
    }

    #[test]
    fn every_policy_picks_a_pool_member() {
        let servers = vec![ServerId(3), ServerId(900), ServerId(ServerId::MAX)];
        let pool = PoolSnapshot::new(
            servers.clone(),
            vec![1, 2, 3],
            LoadMetric::ActiveConnections,
            maglev::DEFAULT_TABLE_SIZE,
        );
        for kind in PolicyKind::ALL {
            let picked = pick_once(kind, &pool).unwrap();
            assert!(servers.contains(&picked), "{}: {picked:?}", kind.name());
        }
    }

    #[test]
    fn policy_names_round_trip() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse(), Ok(kind));
        }
    }
}
