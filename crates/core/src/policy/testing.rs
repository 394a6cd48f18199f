//! Helpers shared by the policies' unit tests.

use rand_core::SeedableRng;

use crate::policy::{LoadMetric, LoadView, PickContext, Policy, PolicyRng, PoolSnapshot};
use crate::types::ServerId;

/// Servers `0..n`, weight 1 each.
pub fn pool(n: u16) -> PoolSnapshot {
    weighted_pool(&vec![1; n as usize])
}

/// Servers `0..weights.len()` with the given weights.
pub fn weighted_pool(weights: &[u32]) -> PoolSnapshot {
    let servers = (0..weights.len() as u16).map(ServerId).collect();
    PoolSnapshot::new(
        servers,
        weights.to_vec(),
        LoadMetric::ActiveConnections,
        crate::policy::maglev::DEFAULT_TABLE_SIZE,
    )
}

/// `count` picks of `policy` on one context, with flow hashes 0, 1, 2...
pub fn picks(
    policy: &mut dyn Policy,
    pool: &PoolSnapshot,
    loads: &LoadView,
    seed: u64,
    count: usize,
) -> Vec<ServerId> {
    let mut rng = PolicyRng::seed_from_u64(seed);
    let mut ctx = PickContext {
        pool,
        flow_hash: 0,
        loads,
        rng: &mut rng,
        now: 0,
    };
    (0..count)
        .map(|i| {
            ctx.flow_hash = i as u64;
            policy.pick(&mut ctx).expect("non-empty pool")
        })
        .collect()
}

/// How many times each server `0..n` appears in `picks`.
pub fn counts(picks: &[ServerId], n: usize) -> Vec<usize> {
    let mut counts = vec![0; n];
    for pick in picks {
        counts[pick.index()] += 1;
    }
    counts
}
