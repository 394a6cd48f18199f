//! Smooth weighted round-robin (nginx's algorithm) over the configured weights.
//!
//! Every pick, each server's credit grows by its weight; the server with the most credit
//! wins and pays the total weight back. Over any `total` consecutive picks each server is
//! picked exactly `weight` times, and its picks are spread through the cycle instead of
//! coming in a burst (weights 5, 1, 1 give `A A B A C A A`, not `A A A A A B C`).
//!
//! A worker picks from the precomputed cycle of those picks ([`Schedule`]) when it fits,
//! one read per pick; the credit scan ([`SmoothWeights`]) serves the weights whose cycle
//! does not.

use crate::policy::schedule::Schedule;
use crate::policy::{PickContext, Policy, PolicyKind, PoolSnapshot};
use crate::types::ServerId;

/// The smooth-WRR credit state over pool positions; also the engine behind AWRR.
#[derive(Clone, Debug)]
pub struct SmoothWeights {
    weights: Vec<i64>,
    credits: Vec<i64>,
    total: i64,
}

impl SmoothWeights {
    /// Starts a cycle over `weights`, one per pool position. A weight of 0 counts as 1: the
    /// pool only holds servers that take new connections.
    pub fn new(weights: &[u32]) -> Self {
        let mut smooth = SmoothWeights {
            weights: vec![0; weights.len()],
            credits: vec![0; weights.len()],
            total: 0,
        };
        smooth.reweight(weights.iter().copied());
        smooth
    }

    /// Starts over from zero credits on `weights` (any number of positions), reusing the
    /// buffers.
    pub fn restart(&mut self, weights: impl IntoIterator<Item = u32>) {
        self.weights.clear();
        self.weights
            .extend(weights.into_iter().map(|w| i64::from(w.max(1))));
        self.total = self.weights.iter().sum();
        self.credits.clear();
        self.credits.resize(self.weights.len(), 0);
    }

    /// Replaces the weights (same number of positions), keeping the credits, so the
    /// servers that were about to be picked still are. Restarting from zero credits on every
    /// change would instead favour the first positions each time.
    pub fn reweight(&mut self, weights: impl IntoIterator<Item = u32>) {
        let mut total = 0;
        let mut count = 0;
        for (slot, weight) in self.weights.iter_mut().zip(weights) {
            *slot = i64::from(weight.max(1));
            total += *slot;
            count += 1;
        }
        debug_assert_eq!(count, self.weights.len(), "one weight per pool position");
        self.total = total;
    }

    /// Each pool position's credit: with the weights, the whole state of the cycle (the
    /// XDP program's copy starts from it).
    pub fn credits(&self) -> &[i64] {
        &self.credits
    }

    /// Number of pool positions.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// Sum of the weights: the length of one full cycle of picks.
    pub fn total(&self) -> u64 {
        self.total as u64
    }

    /// The pool position of the next pick, `None` if there are no positions.
    #[inline]
    pub fn next_position(&mut self) -> Option<usize> {
        let mut best: Option<(usize, i64)> = None;
        for (position, (credit, weight)) in self.credits.iter_mut().zip(&self.weights).enumerate() {
            *credit += weight;
            if best.is_none_or(|(_, best_credit)| *credit > best_credit) {
                best = Some((position, *credit));
            }
        }
        let (position, _) = best?;
        self.credits[position] -= self.total;
        Some(position)
    }

    /// Starts a cycle over `weights` for worker `worker`: `worker` picks into the cycle
    /// (modulo its length), so that workers which all start together do not pick in
    /// lockstep and send the same server a burst.
    pub fn for_worker(weights: &[u32], worker: usize) -> Self {
        let mut smooth = SmoothWeights::new(weights);
        let steps = (worker as u64).checked_rem(smooth.total()).unwrap_or(0);
        for _ in 0..steps {
            smooth.next_position();
        }
        smooth
    }
}

/// A worker's smooth-WRR picks over some weights: from their cycle and a cursor into it
/// when the cycle fits a [`Schedule`], else by the credit scan. Both give the same picks.
#[derive(Clone, Debug)]
pub enum SmoothPicks {
    Scheduled { schedule: Schedule, cursor: u32 },
    Scanned(SmoothWeights),
}

impl SmoothPicks {
    /// `SmoothWeights::for_worker(weights, worker)`'s picks: the cursor starts `worker`
    /// entries into the cycle.
    pub fn for_worker(weights: &[u32], worker: usize) -> Self {
        match Schedule::of_weights(weights) {
            Some(schedule) => SmoothPicks::Scheduled {
                schedule,
                cursor: worker as u32,
            },
            None => SmoothPicks::Scanned(SmoothWeights::for_worker(weights, worker)),
        }
    }

    /// The pool position of the next pick, `None` if there are no positions.
    #[inline]
    pub fn next_position(&mut self) -> Option<usize> {
        match self {
            SmoothPicks::Scheduled { schedule, cursor } => schedule.pick(cursor),
            SmoothPicks::Scanned(smooth) => smooth.next_position(),
        }
    }

    /// Replaces the weights (same number of positions). A schedule becomes the new
    /// weights' cycle and its cursor carries on (taken modulo the new length at the next
    /// pick); weights whose cycle does not fit go on by the scan from zero credits. A scan
    /// keeps its credits ([`SmoothWeights::reweight`]).
    pub fn reweight(&mut self, weights: &[u32]) {
        match self {
            SmoothPicks::Scheduled { schedule, .. } => {
                if !schedule.rebuild(weights) {
                    *self = SmoothPicks::Scanned(SmoothWeights::new(weights));
                }
            }
            SmoothPicks::Scanned(smooth) => smooth.reweight(weights.iter().copied()),
        }
    }
}

/// Smooth WRR on the pool's configured weights, one cursor (or credit vector) per worker.
pub struct WeightedRoundRobin {
    picks: SmoothPicks,
}

impl WeightedRoundRobin {
    /// Worker `w` starts `w` picks into the cycle (see [`SmoothWeights::for_worker`]).
    pub fn new(pool: &PoolSnapshot, worker: usize, _workers: usize) -> Self {
        WeightedRoundRobin {
            picks: SmoothPicks::for_worker(&pool.weights, worker),
        }
    }

    /// How this instance picks: its schedule and cursor, or its credits.
    pub fn picks(&self) -> &SmoothPicks {
        &self.picks
    }
}

impl Policy for WeightedRoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::WeightedRoundRobin
    }

    #[inline]
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId> {
        let position = self.picks.next_position()?;
        ctx.pool.servers.get(position).copied()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::testing::{counts, picks, weighted_pool};
    use crate::policy::LoadView;

    fn sequence(weights: &[u32], worker: usize, count: usize) -> Vec<u16> {
        let pool = weighted_pool(weights);
        let mut wrr = WeightedRoundRobin::new(&pool, worker, 4);
        picks(&mut wrr, &pool, &LoadView::new(), 0, count)
            .iter()
            .map(|s| s.0)
            .collect()
    }

    #[test]
    fn picks_are_interleaved_not_grouped() {
        assert_eq!(sequence(&[5, 1, 1], 0, 7), [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn workers_start_at_different_phases() {
        let first = sequence(&[5, 1, 1], 0, 14);
        let second = sequence(&[5, 1, 1], 1, 14);
        assert_ne!(first, second);
        assert_eq!(
            second[..13],
            first[1..],
            "worker 1 is one pick ahead of worker 0"
        );
    }

    #[test]
    fn equal_weights_is_plain_round_robin() {
        assert_eq!(sequence(&[1, 1, 1], 0, 6), [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn reweighting_keeps_the_cycle_going() {
        let mut weights = SmoothWeights::new(&[1; 4]);
        let before: Vec<usize> = (0..2).map(|_| weights.next_position().unwrap()).collect();
        weights.reweight([1; 4]);
        let after: Vec<usize> = (0..2).map(|_| weights.next_position().unwrap()).collect();
        assert_eq!(
            [before, after].concat(),
            [0, 1, 2, 3],
            "a reweight must not restart at 0"
        );
    }

    #[test]
    fn weights_whose_cycle_fits_pick_from_a_schedule_and_others_scan() {
        let pool = weighted_pool(&[5, 1, 1]);
        let wrr = WeightedRoundRobin::new(&pool, 0, 1);
        assert!(matches!(wrr.picks(), SmoothPicks::Scheduled { .. }));
        // More positions than a byte names: weights 1 to 5 over 300 servers, 900 entries.
        let weights: Vec<u32> = (0..300).map(|i| 1 + i % 5).collect();
        let wrr = WeightedRoundRobin::new(&weighted_pool(&weights), 0, 1);
        assert!(matches!(wrr.picks(), SmoothPicks::Scheduled { .. }));
        let pool = weighted_pool(&[16_300, 97, 3]);
        let wrr = WeightedRoundRobin::new(&pool, 0, 1);
        assert!(matches!(wrr.picks(), SmoothPicks::Scanned(_)));
        assert_eq!(sequence(&[16_300, 97, 3], 3, 5), [0, 0, 0, 0, 0]);
    }

    #[test]
    fn empty_weights_pick_nothing() {
        assert_eq!(SmoothWeights::new(&[]).next_position(), None);
    }

    proptest! {
        #[test]
        fn every_full_cycle_matches_the_weights_exactly(
            weights in prop::collection::vec(1u32..20, 1..12),
            worker in 0usize..64,
            cycles in 1usize..4,
        ) {
            let total: usize = weights.iter().map(|&w| w as usize).sum();
            let picked = sequence(&weights, worker, cycles * total);
            let picked: Vec<ServerId> = picked.into_iter().map(ServerId).collect();
            let expected: Vec<usize> = weights.iter().map(|&w| cycles * w as usize).collect();
            prop_assert_eq!(counts(&picked, weights.len()), expected);
        }

        #[test]
        fn every_prefix_stays_close_to_the_exact_share(weights in prop::collection::vec(1u32..20, 1..12)) {
            // After k picks server i has had about k * w_i / total; grouping its picks
            // (weights 10, 10 as ten A then ten B) would put it 5 away at k = 10.
            let total: usize = weights.iter().map(|&w| w as usize).sum();
            let picked = sequence(&weights, 0, total);
            let mut counts = vec![0usize; weights.len()];
            for (k, &server) in picked.iter().enumerate() {
                counts[server as usize] += 1;
                for (server, &weight) in weights.iter().enumerate() {
                    let share = (k + 1) as f64 * weight as f64 / total as f64;
                    prop_assert!((counts[server] as f64 - share).abs() < 2.0, "{:?}", picked);
                }
            }
        }
    }
}
