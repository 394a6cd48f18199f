//! Automatic weighted round-robin (CHEETAH paper, section 4.1): smooth WRR whose weights
//! follow the servers' loads.
//!
//! Each server gets `N_i = round(10 * L_avg / ((1 - a) * L_i + a * L_avg))` buckets, with
//! `a = 0.5`, clamped to `[2, 30]`: a server at the average load gets 10, a less loaded one
//! more, a busier one fewer. The buckets are recomputed whenever the worker merges loads
//! (every 10 ms), never per pick, and served as smooth WRR from their cycle
//! ([`SmoothPicks`], a [`Schedule`](crate::policy::schedule::Schedule), which a pool of
//! more than 819 servers fits by coarser buckets: [`fit_to_schedule`]):
//! when a merge changes the buckets, the new buckets' cycle replaces the old and the
//! worker's cursor carries on into it (modulo its length). The XDP program serves the
//! kernel's awrr VIPs from the same cycles, which the daemon builds from the same rule
//! ([`awrr_buckets_into`]).
//!
//! Why dropping the credits keeps the balance: a smooth cycle spreads every server's
//! picks through it, so any window of `k` consecutive picks gives each server within
//! about one pick of `k * N_i / total` (wrr.rs proves this of every prefix; a window of a
//! periodic sequence is a prefix of a rotation). A switch therefore costs at most about
//! one pick per server against the exact shares, the same order as what carried credits
//! save, and the picks between two merges (10 ms) follow the new buckets from the first.
//! A new cycle is written out once (its length times the distinct buckets in steps, into
//! the old cycle's buffers), on a merge whose buckets changed only.
//!
//! Unlike least-loaded, AWRR keeps sending some connections to every server between two
//! load reports, so a stale report cannot make one server take every new connection.

use crate::policy::schedule::{cycle_len, SCHEDULE_CAP};
use crate::policy::wrr::SmoothPicks;
use crate::policy::{LoadView, PickContext, Policy, PolicyKind, PoolSnapshot};
use crate::types::ServerId;

/// Buckets of a server at exactly the average load.
pub const BALANCED_BUCKETS: u32 = 10;
/// Fewest buckets: even the busiest server keeps getting a trickle of connections, so its
/// load keeps being measured.
pub const MIN_BUCKETS: u32 = 2;
/// Most buckets, 3 x [`BALANCED_BUCKETS`] as in the paper. With `a = 0.5` the formula
/// never exceeds 20 (reached by an idle server), so the cap only matters for smaller `a`.
pub const MAX_BUCKETS: u32 = 30;
/// The paper's `a`: how far a server's own load is blended with the average, which damps
/// the reaction to a load difference (0 would follow loads at full strength).
pub const CONVERGENCE: f64 = 0.5;

/// Buckets for a server with load `load` in a pool whose average load is `average`.
///
/// Loads are non-negative; anything else (NaN, negative) counts as idle. When the whole
/// pool is idle every server gets [`BALANCED_BUCKETS`].
pub fn awrr_bucket(load: f64, average: f64) -> u32 {
    let load = sanitize(load);
    let average = sanitize(average);
    if average == 0.0 {
        return BALANCED_BUCKETS;
    }
    let buckets = f64::from(BALANCED_BUCKETS) * average
        / ((1.0 - CONVERGENCE) * load + CONVERGENCE * average);
    (buckets.round() as u32).clamp(MIN_BUCKETS, MAX_BUCKETS)
}

/// Buckets for each of `loads`, in order.
pub fn awrr_buckets(loads: &[f64]) -> Vec<u32> {
    let average = average(loads.iter().copied());
    loads
        .iter()
        .map(|&load| awrr_bucket(load, average))
        .collect()
}

fn sanitize(load: f64) -> f64 {
    if load.is_finite() && load > 0.0 {
        load
    } else {
        0.0
    }
}

fn average(loads: impl ExactSizeIterator<Item = f64>) -> f64 {
    let count = loads.len();
    if count == 0 {
        return 0.0;
    }
    loads.map(sanitize).sum::<f64>() / count as f64
}

/// Buckets of each of `pool`'s servers under `loads` (its metric), written into
/// `buckets`: the one rule the workers and the daemon's kernel schedules both follow.
/// Their cycle always fits a [`Schedule`](crate::policy::schedule::Schedule)
/// ([`fit_to_schedule`]).
pub fn awrr_buckets_into(pool: &PoolSnapshot, loads: &LoadView, buckets: &mut Vec<u32>) {
    let load_of = |id: &ServerId| loads.load(*id, pool.metric);
    let average = average(pool.servers.iter().map(load_of));
    buckets.clear();
    buckets.extend(
        pool.servers
            .iter()
            .map(|id| awrr_bucket(load_of(id), average)),
    );
    fit_to_schedule(buckets);
}

/// Scales `buckets` down, if their cycle is over [`SCHEDULE_CAP`], to `1 + b * spare /
/// total` each (`spare` = the cap less one per server), whose sum is at most the cap.
///
/// Why coarser buckets, not the credit scan: a pool of up to 819 servers always fits (at
/// most 20 buckets each, `buckets_stay_within_two_and_twenty`), and is left as it is. A
/// bigger one whose loads differ would otherwise be served by a scan of the whole pool on
/// every pick (16,384 steps for the biggest), which the XDP program cannot run, so each of
/// its SYNs would go up to userspace. Scaled, a busier server still gets no more buckets
/// than a less busy one, the cycle stays one read per pick on both data paths, and the
/// loads' resolution shrinks with the pool: about 15 levels at 2,000 servers, 3 at
/// 8,192, plain round-robin at 16,384.
pub fn fit_to_schedule(buckets: &mut [u32]) {
    if buckets.len() > SCHEDULE_CAP || cycle_len(buckets).is_some() {
        return;
    }
    let total: u64 = buckets.iter().map(|&b| u64::from(b)).sum();
    let spare = (SCHEDULE_CAP - buckets.len()) as u64;
    for bucket in buckets.iter_mut() {
        // At most 1 + spare * b / total <= 1 + spare: a u32.
        *bucket = 1 + (u64::from(*bucket) * spare / total) as u32;
    }
}

/// Per-worker AWRR: smooth WRR over buckets derived from the pool's load metric.
pub struct AutoWeightedRoundRobin {
    buckets: Vec<u32>,
    /// The buckets a merge computes, compared with `buckets` before any rebuild.
    merged: Vec<u32>,
    picks: SmoothPicks,
}

impl AutoWeightedRoundRobin {
    /// Starts every server at [`BALANCED_BUCKETS`] (no load known yet), with worker `w`
    /// `w` picks into the cycle so that workers do not pick in lockstep.
    pub fn new(pool: &PoolSnapshot, worker: usize, _workers: usize) -> Self {
        let buckets = vec![BALANCED_BUCKETS; pool.servers.len()];
        AutoWeightedRoundRobin {
            picks: SmoothPicks::for_worker(&buckets, worker),
            merged: Vec::with_capacity(buckets.len()),
            buckets,
        }
    }

    /// The buckets the picks follow now.
    pub fn buckets(&self) -> &[u32] {
        &self.buckets
    }
}

impl Policy for AutoWeightedRoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::AutoWeightedRoundRobin
    }

    #[inline]
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId> {
        debug_assert_eq!(
            self.buckets.len(),
            ctx.pool.servers.len(),
            "built for another pool"
        );
        let position = self.picks.next_position()?;
        ctx.pool.servers.get(position).copied()
    }

    fn on_loads_merged(&mut self, pool: &PoolSnapshot, loads: &LoadView) {
        if self.buckets.len() != pool.servers.len() {
            *self = AutoWeightedRoundRobin::new(pool, 0, 1);
        }
        awrr_buckets_into(pool, loads, &mut self.merged);
        if self.merged != self.buckets {
            std::mem::swap(&mut self.merged, &mut self.buckets);
            self.picks.reweight(&self.buckets);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::testing::{counts, picks};
    use crate::policy::LoadMetric;

    #[test]
    fn balanced_pool_gets_ten_buckets_each() {
        assert_eq!(awrr_buckets(&[0.4; 5]), vec![10; 5]);
        assert_eq!(awrr_buckets(&[250.0; 3]), vec![10; 3]);
    }

    #[test]
    fn idle_pool_gets_ten_buckets_each() {
        assert_eq!(awrr_buckets(&[0.0; 4]), vec![10; 4]);
    }

    #[test]
    fn idle_server_gets_twenty_buckets() {
        // 10 * avg / (0.5 * 0 + 0.5 * avg) = 20, whatever the average.
        assert_eq!(awrr_buckets(&[0.0, 0.6, 0.6]), vec![20, 8, 8]);
        assert_eq!(awrr_bucket(0.0, 1e-9), 20);
    }

    #[test]
    fn formula_matches_the_paper() {
        // Twice the average: 10 / (1 + 0.5) = 6.67; half the average: 10 / 0.75 = 13.33.
        assert_eq!(awrr_bucket(2.0, 1.0), 7);
        assert_eq!(awrr_bucket(0.5, 1.0), 13);
        assert_eq!(awrr_buckets(&[0.0, 1.0, 2.0]), vec![20, 10, 7]);
    }

    #[test]
    fn very_busy_server_keeps_two_buckets() {
        assert_eq!(awrr_bucket(1e9, 1.0), MIN_BUCKETS);
        let mut loads = vec![1.0; 100];
        loads.push(10_000.0);
        assert_eq!(*awrr_buckets(&loads).last().unwrap(), MIN_BUCKETS);
    }

    #[test]
    fn malformed_loads_count_as_idle() {
        assert_eq!(
            awrr_buckets(&[f64::NAN, -1.0, 1.0]),
            awrr_buckets(&[0.0, 0.0, 1.0])
        );
    }

    proptest! {
        #[test]
        fn buckets_stay_within_two_and_twenty(loads in prop::collection::vec(0.0f64..1e6, 1..50)) {
            // The 30 cap of the paper is unreachable with a = 0.5: an idle server gets 20.
            for buckets in awrr_buckets(&loads) {
                prop_assert!((MIN_BUCKETS..=20).contains(&buckets));
            }
        }

        /// Scaled buckets fit, keep the order of the loads, and change nothing that fit.
        #[test]
        fn scaled_buckets_fit_and_keep_their_order(
            servers in 1usize..=16384,
            seed in prop::collection::vec(MIN_BUCKETS..=20u32, 1..64),
        ) {
            let raw: Vec<u32> = (0..servers).map(|i| seed[i % seed.len()]).collect();
            let mut fitted = raw.clone();
            fit_to_schedule(&mut fitted);
            prop_assert!(cycle_len(&fitted).is_some());
            if cycle_len(&raw).is_some() {
                prop_assert_eq!(&fitted, &raw);
            }
            // Sorted by the raw buckets, the scaled ones never go down.
            let mut pairs: Vec<(u32, u32)> = raw.into_iter().zip(fitted).collect();
            pairs.sort_unstable();
            prop_assert!(pairs.windows(2).all(|w| w[0].1 <= w[1].1));
        }
    }

    #[test]
    fn picks_follow_the_buckets_after_a_merge() {
        let servers = vec![ServerId(4), ServerId(5), ServerId(6)];
        let pool = PoolSnapshot::new(
            servers.clone(),
            vec![1; 3],
            LoadMetric::Reported,
            crate::policy::maglev::DEFAULT_TABLE_SIZE,
        );
        let mut loads = LoadView::new();
        for (id, load) in servers.iter().zip([0.0, 1.0, 2.0]) {
            loads.set_load(*id, LoadMetric::Reported, load);
            // Another metric must not leak in.
            loads.set_load(*id, LoadMetric::ActiveConnections, 100.0 - load);
        }
        let mut awrr = AutoWeightedRoundRobin::new(&pool, 0, 1);
        awrr.on_loads_merged(&pool, &loads);
        let picked = picks(&mut awrr, &pool, &loads, 0, 37);
        let picked: Vec<ServerId> = picked.iter().map(|id| ServerId(id.0 - 4)).collect();
        assert_eq!(counts(&picked, 3), [20, 10, 7]);
    }

    fn reported_pool(servers: u16) -> (PoolSnapshot, Vec<ServerId>) {
        let ids: Vec<ServerId> = (0..servers).map(ServerId).collect();
        let pool = PoolSnapshot::new(
            ids.clone(),
            vec![1; ids.len()],
            LoadMetric::Reported,
            crate::policy::maglev::DEFAULT_TABLE_SIZE,
        );
        (pool, ids)
    }

    fn merge(awrr: &mut AutoWeightedRoundRobin, pool: &PoolSnapshot, loads: &[f64]) {
        let mut view = LoadView::new();
        for (id, load) in pool.servers.iter().zip(loads) {
            view.set_load(*id, LoadMetric::Reported, *load);
        }
        awrr.on_loads_merged(pool, &view);
    }

    #[test]
    fn a_merge_that_changes_the_buckets_carries_the_cursor_into_the_new_cycle() {
        let (pool, _) = reported_pool(3);
        let mut awrr = AutoWeightedRoundRobin::new(&pool, 0, 1);
        // Balanced: the cycle 0 1 2; two picks leave the cursor at 2.
        let before = picks(&mut awrr, &pool, &LoadView::new(), 0, 2);
        merge(&mut awrr, &pool, &[0.0, 1.0, 2.0]);
        assert_eq!(awrr.buckets(), [20, 10, 7]);
        let cycle = crate::policy::schedule::Schedule::of_weights(&[20, 10, 7]).unwrap();
        let after = picks(&mut awrr, &pool, &LoadView::new(), 0, 3);
        let expected: Vec<ServerId> = cycle.cycle()[2..5].iter().map(|&p| ServerId(p)).collect();
        assert_eq!(before, [ServerId(0), ServerId(1)]);
        assert_eq!(
            after, expected,
            "entry 2 of the new cycle on, not its start"
        );
    }

    #[test]
    fn buckets_whose_cycle_is_over_the_cap_are_scaled_to_fit_and_still_follow_the_loads() {
        // Balanced, 1,640 servers make a cycle of 1,640; then buckets 20, 7, 10, 10, ..
        // would make one of 16,407 entries, over SCHEDULE_CAP: scaled by 14,744 / 16,407.
        let (pool, _) = reported_pool(1640);
        let mut awrr = AutoWeightedRoundRobin::new(&pool, 5, 8);
        let loads: Vec<f64> = (0..1640)
            .map(|i| match i {
                0 => 0.0,
                1 => 2.0,
                _ => 1.0,
            })
            .collect();
        merge(&mut awrr, &pool, &loads);
        assert!(matches!(awrr.picks, SmoothPicks::Scheduled { .. }));
        assert_eq!(awrr.buckets()[..3], [18, 7, 9]);
        let total: u32 = awrr.buckets().iter().sum();
        assert_eq!(total, 18 + 7 + 1638 * 9);
        let picked = picks(&mut awrr, &pool, &LoadView::new(), 0, total as usize);
        let picked = counts(&picked, 1640);
        assert_eq!(picked[..3], [18, 7, 9]);
    }

    #[test]
    fn the_biggest_pool_fits_and_a_pool_of_819_is_never_scaled() {
        let mut idle_and_busy: Vec<u32> = (0..16384).map(|i| [20, 2, 10][i % 3]).collect();
        fit_to_schedule(&mut idle_and_busy);
        assert_eq!(
            idle_and_busy,
            vec![1; 16384],
            "no spare bucket: round-robin"
        );
        let mut one_idle = vec![MIN_BUCKETS; 819];
        one_idle[0] = 20;
        one_idle[1] = 19;
        let kept = one_idle.clone();
        fit_to_schedule(&mut one_idle);
        assert_eq!(one_idle, kept);
    }

    proptest! {
        /// Why dropping the credits keeps awrr's balance (module doc): after a merge, the
        /// picks of any window stay within about one of each server's share of the new
        /// buckets, wherever the cursor was.
        #[test]
        fn after_a_merge_every_window_keeps_to_the_new_buckets(
            before in prop::collection::vec(0.0f64..4.0, 2..12),
            after_seed in prop::collection::vec(0.0f64..4.0, 12),
            picked_before in 0usize..300,
            worker in 0usize..16,
        ) {
            let n = before.len();
            let after = &after_seed[..n];
            let (pool, _) = reported_pool(n as u16);
            let mut awrr = AutoWeightedRoundRobin::new(&pool, worker, 16);
            merge(&mut awrr, &pool, &before);
            picks(&mut awrr, &pool, &LoadView::new(), 0, picked_before);
            merge(&mut awrr, &pool, after);
            let buckets = awrr.buckets().to_vec();
            let total: u32 = buckets.iter().sum();
            let picked = picks(&mut awrr, &pool, &LoadView::new(), 0, 2 * total as usize);
            let mut counts = vec![0usize; n];
            for (k, id) in picked.iter().enumerate() {
                counts[id.index()] += 1;
                for (server, &b) in buckets.iter().enumerate() {
                    let share = (k + 1) as f64 * f64::from(b) / f64::from(total);
                    prop_assert!((counts[server] as f64 - share).abs() < 2.0,
                        "server {} after {} picks: {} against {:.2}", server, k + 1, counts[server], share);
                }
            }
        }
    }

    #[test]
    fn starts_balanced_before_any_load_is_known() {
        let pool = crate::policy::testing::pool(4);
        let mut awrr = AutoWeightedRoundRobin::new(&pool, 2, 4);
        let picked = picks(&mut awrr, &pool, &LoadView::new(), 0, 40);
        assert_eq!(counts(&picked, 4), [10; 4]);
    }
}
