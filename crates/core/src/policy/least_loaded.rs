//! Least loaded: the pool member with the lowest load under the pool's metric.
//!
//! Works well with a load that moves with every pick, such as the worker's own view of
//! active connections (the pipeline counts each pick into it at once). With a load
//! reported from outside it herds: every connection goes to the same server until the
//! next report (paper section 4.1), which is what AWRR and power of two avoid.

use crate::policy::{PickContext, Policy, PolicyKind};
use crate::types::ServerId;

/// Scans the pool from a per-worker cursor; the first minimum found wins.
///
/// The cursor starts at the worker index and advances one position per pick, so ties
/// (an idle pool, equal reports) spread over the tied servers and over the workers
/// instead of all landing on the first of them.
pub struct LeastLoaded {
    cursor: usize,
}

impl LeastLoaded {
    pub fn new(worker: usize) -> Self {
        LeastLoaded { cursor: worker }
    }

    /// Where the next pick's scan starts (modulo the pool's size), for the XDP program's
    /// instance to start where this one does.
    pub fn cursor(&self) -> usize {
        self.cursor
    }
}

impl Policy for LeastLoaded {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LeastLoaded
    }

    #[inline]
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId> {
        let servers = &ctx.pool.servers;
        if servers.is_empty() {
            return None;
        }
        let start = self.cursor % servers.len();
        self.cursor = start + 1;
        let (metric, loads) = (ctx.pool.metric, ctx.loads);
        let mut best = servers[start];
        let mut best_load = loads.load(best, metric);
        for &server in servers[start + 1..].iter().chain(&servers[..start]) {
            let load = loads.load(server, metric);
            if load < best_load {
                best = server;
                best_load = load;
            }
        }
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{counts, picks, pool};
    use crate::policy::{LoadMetric, LoadView};

    #[test]
    fn picks_the_minimum() {
        let pool = pool(5);
        let mut loads = LoadView::new();
        for (id, load) in pool.servers.iter().zip([4.0, 3.0, 7.0, 1.0, 2.0]) {
            loads.set_load(*id, LoadMetric::ActiveConnections, load);
        }
        for worker in 0..5 {
            let picked = picks(&mut LeastLoaded::new(worker), &pool, &loads, 0, 10);
            assert!(
                picked.iter().all(|&id| id == ServerId(3)),
                "worker {worker}: {picked:?}"
            );
        }
    }

    #[test]
    fn uses_the_pool_metric() {
        let servers = vec![ServerId(0), ServerId(1)];
        let pool = crate::policy::PoolSnapshot::new(
            servers,
            vec![1, 1],
            LoadMetric::Reported,
            crate::policy::maglev::DEFAULT_TABLE_SIZE,
        );
        let mut loads = LoadView::new();
        loads.set_load(ServerId(0), LoadMetric::Reported, 0.9);
        loads.set_load(ServerId(1), LoadMetric::Reported, 0.1);
        loads.set_load(ServerId(1), LoadMetric::ActiveConnections, 50.0);
        assert_eq!(
            picks(&mut LeastLoaded::new(0), &pool, &loads, 0, 1),
            [ServerId(1)]
        );
    }

    #[test]
    fn ties_rotate_from_the_worker_index() {
        let pool = pool(4);
        let mut loads = LoadView::new();
        loads.set_load(ServerId(2), LoadMetric::ActiveConnections, 1.0);
        let picked: Vec<u16> = picks(&mut LeastLoaded::new(1), &pool, &loads, 0, 6)
            .iter()
            .map(|id| id.0)
            .collect();
        // Starting at 1, skipping the busier server 2.
        assert_eq!(picked, [1, 3, 3, 0, 1, 3]);
        let idle = counts(
            &picks(&mut LeastLoaded::new(0), &pool, &LoadView::new(), 0, 40),
            4,
        );
        assert_eq!(idle, [10; 4]);
    }

    #[test]
    fn follows_its_own_picks_through_the_worker_view() {
        use std::sync::Arc;

        use rand_core::SeedableRng;

        use crate::policy::load::{SharedLoads, WorkerLoads};
        use crate::policy::PolicyRng;

        let pool = pool(3);
        let mut worker = WorkerLoads::new(Arc::new(SharedLoads::new()));
        worker.watch(&pool.servers);
        worker.on_new_connection(ServerId(0));
        worker.on_new_connection(ServerId(0));
        let mut policy = LeastLoaded::new(0);
        let mut rng = PolicyRng::seed_from_u64(0);
        let mut picked = Vec::new();
        for _ in 0..6 {
            let mut ctx = PickContext {
                pool: &pool,
                flow_hash: 0,
                loads: worker.view(),
                rng: &mut rng,
                now: 0,
            };
            let id = policy.pick(&mut ctx).unwrap();
            worker.on_new_connection(id);
            picked.push(id.0);
        }
        assert_eq!(
            picked,
            [1, 2, 2, 1, 1, 2],
            "server 0 starts with two connections"
        );
    }
}
