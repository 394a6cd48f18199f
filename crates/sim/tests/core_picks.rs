//! The simulator places connections with the core's own policy code: replaying a run's
//! arrivals through `cheetah_core::policy` directly, with the same seed and the same load
//! view, picks the same server every time. AWRR also gets the same reported loads and
//! `on_loads_merged` calls, every `MERGE_INTERVAL` as a worker does.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use cheetah_core::policy::{
    self, LoadMetric, LoadView, PickContext, PolicyKind, PolicyRng, PoolSnapshot, MERGE_INTERVAL,
};
use cheetah_core::ServerId;
use cheetah_sim::engine::{run, stream_seed, RunOptions, Stream};
use cheetah_sim::lbs::LbSpec;
use cheetah_sim::scenario::Scenario;
use cheetah_sim::workload::WorkloadSpec;
use rand_core::SeedableRng;

/// AWRR only departs from plain rotation when servers are ~10% off the average, so it
/// gets few connections per server (and a longer run) to make its merges matter.
fn scenario(kind: PolicyKind) -> Scenario {
    let awrr = kind == PolicyKind::AutoWeightedRoundRobin;
    Scenario {
        seed: 42,
        servers: 12,
        weights: vec![1, 2, 3],
        active_connections: if awrr { 120.0 } else { 2000.0 },
        warmup_s: 0.0,
        duration_s: if awrr { 600.0 } else { 30.0 },
        workload: WorkloadSpec {
            no_timestamp_share: 0.1,
            ..WorkloadSpec::default()
        },
        ..Scenario::default()
    }
}

#[test]
fn simulator_and_core_pick_the_same_servers_for_the_same_seed() {
    for kind in PolicyKind::ALL {
        let scenario = scenario(kind);
        let simulated = run(
            &scenario,
            &LbSpec::Cheetah { policy: kind },
            None,
            &RunOptions {
                record_placements: true,
                progress: None,
            },
        );
        assert!(simulated.placements.len() > 600, "{}", kind.name());

        // The same pool, policy instance, generator and load view, driven by hand.
        let servers: Vec<ServerId> = (0..12).map(ServerId).collect();
        let weights: Vec<u32> = (0..12).map(|i| [1, 2, 3][i % 3]).collect();
        let pool = PoolSnapshot::new(
            servers,
            weights,
            kind.default_metric(),
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        );
        let mut policy = policy::build(kind, &pool, 0, 1);
        let mut rng = PolicyRng::seed_from_u64(stream_seed(scenario.seed, Stream::Policy));
        let mut loads = LoadView::new();
        let mut active = [0u32; 12];
        let mut departures = BinaryHeap::new();
        policy.on_loads_merged(&pool, &loads);
        let mut next_merge = MERGE_INTERVAL;
        for placement in &simulated.placements {
            // Connections ending at or before this arrival have left (departures first),
            // and AWRR merged the servers' reports every 10 ms meanwhile.
            loop {
                let departure = departures.peek().map(|&Reverse((until, _))| until);
                let merge_first = kind == PolicyKind::AutoWeightedRoundRobin
                    && next_merge <= placement.at
                    && departure.is_none_or(|until| next_merge < until);
                if merge_first {
                    for (index, &count) in active.iter().enumerate() {
                        loads.set_load(
                            ServerId(index as u16),
                            LoadMetric::Reported,
                            f64::from(count),
                        );
                    }
                    policy.on_loads_merged(&pool, &loads);
                    next_merge += MERGE_INTERVAL;
                    continue;
                }
                let Some(&Reverse((until, server))) = departures.peek() else {
                    break;
                };
                if until > placement.at {
                    break;
                }
                departures.pop();
                let server: u16 = server;
                active[server as usize] -= 1;
                loads.set_load(
                    ServerId(server),
                    LoadMetric::ActiveConnections,
                    f64::from(active[server as usize]),
                );
            }
            let expected = if placement.timestamps {
                let mut ctx = PickContext {
                    pool: &pool,
                    flow_hash: placement.flow_hash,
                    loads: &loads,
                    rng: &mut rng,
                    now: placement.at,
                };
                policy.pick(&mut ctx).unwrap()
            } else {
                // No timestamp: the pipeline's fallback places by the pool's Maglev table.
                pool.maglev.lookup(placement.flow_hash).unwrap()
            };
            assert_eq!(
                placement.server,
                expected,
                "{} at {}",
                kind.name(),
                placement.at
            );
            let index = expected.index();
            active[index] += 1;
            loads.set_load(
                expected,
                LoadMetric::ActiveConnections,
                f64::from(active[index]),
            );
            departures.push(Reverse((placement.until, expected.0)));
        }
    }
}
