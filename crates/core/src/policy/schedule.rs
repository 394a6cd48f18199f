//! Smooth weighted round-robin as a precomputed cycle, so that a pick costs one read
//! instead of a scan of the pool.
//!
//! [`SmoothWeights`](crate::policy::wrr::SmoothWeights) from zero credits is periodic:
//! after `total` picks (the sum of the weights) every server has been picked exactly its
//! weight's times and every credit is back to zero. Scaling every weight by `k` scales
//! every credit by `k` and changes no comparison, so the weights divided by their gcd give
//! the same picks with a shorter period. A [`Schedule`] is that shortest period written
//! out as pool positions, and `SmoothWeights::for_worker(weights, w)`'s i-th pick is
//! `cycle[(w + i) % len]`.
//!
//! The cycle is built where the weights change (a snapshot for wrr, a merge for awrr) and
//! read per pick, by the core's workers and, as the same 16-bit positions, by the XDP
//! program (docs/dataplane.md "Schedules"). The cycle has at most [`SCHEDULE_CAP`] entries,
//! so it names at most that many positions (each server is picked at least once a cycle);
//! weights beyond it keep the credit scan. (The daemon writes longer wrr cycles out for
//! the XDP program, which cannot scan a big pool's credits: [`Schedule::of_weights_within`].)
//!
//! Writing a cycle out costs its length times the number of distinct weights in steps
//! (`WeightGroups`), not times the pool's size: an awrr pool has at most 29 distinct
//! buckets (2 to 30), so a merge that changes them rebuilds any cycle in at most
//! 16,384 x 29 steps, where the credit scan would take the cycle's length times the
//! pool's size (up to 16,384 x 16,384).

/// Most entries of a cycle (after dividing by the gcd): 32 KiB of positions per VIP, which
/// holds any awrr cycle of up to 819 servers (at most 20 buckets each; a bigger pool's
/// buckets are scaled to fit: `awrr::fit_to_schedule`), and bounds a rebuild at
/// `SCHEDULE_CAP` times the distinct weights in steps.
pub const SCHEDULE_CAP: usize = 16384;
/// Most pool positions a cycle can name: a cycle of at most [`SCHEDULE_CAP`] entries picks
/// every position at least once, so no more than that many.
pub const SCHEDULE_MAX_POSITIONS: usize = SCHEDULE_CAP;
// Positions are u16.
const _: () = assert!(SCHEDULE_MAX_POSITIONS <= u16::MAX as usize + 1);

/// One cycle of smooth-WRR picks from zero credits, as pool positions.
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    cycle: Vec<u16>,
    /// What writes the cycle out, kept so a rebuild reuses its buffers.
    builder: WeightGroups,
}

impl Schedule {
    /// The cycle of `weights` (one per pool position; 0 counts as 1, as in
    /// `SmoothWeights`), or `None` if it does not fit.
    pub fn of_weights(weights: &[u32]) -> Option<Schedule> {
        let mut schedule = Schedule::default();
        schedule.rebuild(weights).then_some(schedule)
    }

    /// [`Schedule::of_weights`] with room for `cap` entries instead of [`SCHEDULE_CAP`]:
    /// the daemon writes longer wrr cycles out for the XDP program, which reads them in
    /// chunks, where a worker scans the credits instead.
    pub fn of_weights_within(weights: &[u32], cap: usize) -> Option<Schedule> {
        let mut schedule = Schedule::default();
        schedule.rebuild_within(weights, cap).then_some(schedule)
    }

    /// Replaces the cycle by `weights`'s, reusing the buffers; `false` (and an empty
    /// cycle) if it does not fit.
    pub fn rebuild(&mut self, weights: &[u32]) -> bool {
        self.rebuild_within(weights, SCHEDULE_CAP)
    }

    /// [`Schedule::rebuild`] with room for `cap` entries.
    fn rebuild_within(&mut self, weights: &[u32], cap: usize) -> bool {
        self.cycle.clear();
        let Some(len) = cycle_len_within(weights, cap) else {
            return false;
        };
        let divisor = weights.iter().fold(0, |g, &w| gcd(g, w.max(1)));
        self.builder
            .write_cycle(weights, divisor, len, &mut self.cycle);
        true
    }

    /// The pool positions of one cycle, in pick order.
    pub fn cycle(&self) -> &[u16] {
        &self.cycle
    }

    pub fn len(&self) -> usize {
        self.cycle.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cycle.is_empty()
    }

    /// The pool position at `cursor` (taken modulo the cycle's length: a cursor carried
    /// over from a longer cycle, or a worker's starting offset), and `cursor` moves on to
    /// the next entry; `None` for an empty cycle. The XDP program's `schedule_decide`
    /// (bpf/lib/schedule.h) is this step for step.
    #[inline]
    pub fn pick(&self, cursor: &mut u32) -> Option<usize> {
        let len = self.cycle.len() as u32;
        if len == 0 {
            return None;
        }
        let at = if *cursor < len {
            *cursor
        } else {
            *cursor % len
        };
        *cursor = if at + 1 == len { 0 } else { at + 1 };
        Some(usize::from(self.cycle[at as usize]))
    }
}

/// Smooth WRR's picks from zero credits, one candidate per distinct weight.
///
/// From zero credits, every position of one weight gains the same credit each step, and a
/// pick costs the picked position the total. So among the positions of one weight, those
/// picked fewest times so far hold the most credit, and the scan's tie-break (the first
/// position wins) takes the lowest of them: a weight's picks go round its positions in
/// order, and its next position's credit drops by the total only when the round wraps.
/// The scan's winner is then the group's next position with the most credit, the lowest
/// position on a tie: `SmoothWeights`' picks, comparing one candidate per weight.
#[derive(Clone, Debug, Default)]
struct WeightGroups {
    /// Pool positions ordered by (weight, position): each group's, in position order.
    members: Vec<u16>,
    groups: Vec<WeightGroup>,
}

#[derive(Clone, Copy, Debug)]
struct WeightGroup {
    /// The group's weight divided by the gcd of all of them.
    weight: i64,
    /// The credit of the group's next position.
    credit: i64,
    /// The group's positions are `members[start..end]`, `next` the one to pick next.
    start: usize,
    end: usize,
    next: usize,
}

impl WeightGroups {
    /// Replaces `cycle` by the first `len` picks over `weights` (0 counts as 1) divided by
    /// `divisor`, their gcd; `len` is their sum, one whole cycle.
    fn write_cycle(&mut self, weights: &[u32], divisor: u32, len: usize, cycle: &mut Vec<u16>) {
        let reduced = |position: u16| i64::from(weights[usize::from(position)].max(1) / divisor);
        self.members.clear();
        self.members.extend(0..weights.len() as u16);
        self.members
            .sort_unstable_by_key(|&position| (reduced(position), position));
        self.groups.clear();
        for (index, &position) in self.members.iter().enumerate() {
            let weight = reduced(position);
            match self.groups.last_mut() {
                Some(group) if group.weight == weight => group.end = index + 1,
                _ => self.groups.push(WeightGroup {
                    weight,
                    credit: 0,
                    start: index,
                    end: index + 1,
                    next: index,
                }),
            }
        }
        let total = len as i64;
        cycle.clear();
        for _ in 0..len {
            let mut best = 0;
            for index in 0..self.groups.len() {
                self.groups[index].credit += self.groups[index].weight;
                let (group, leader) = (&self.groups[index], &self.groups[best]);
                if index != best
                    && (group.credit > leader.credit
                        || (group.credit == leader.credit
                            && self.members[group.next] < self.members[leader.next]))
                {
                    best = index;
                }
            }
            let group = &mut self.groups[best];
            cycle.push(self.members[group.next]);
            group.next += 1;
            if group.next == group.end {
                group.next = group.start;
                group.credit -= total;
            }
        }
    }
}

/// The length of `weights`'s cycle if it fits a [`Schedule`]: the sum of the weights
/// divided by their gcd.
pub fn cycle_len(weights: &[u32]) -> Option<usize> {
    cycle_len_within(weights, SCHEDULE_CAP)
}

/// The length of `weights`'s cycle if it has at most `cap` entries (and names at most
/// [`SCHEDULE_MAX_POSITIONS`] positions, 16 bits each).
pub fn cycle_len_within(weights: &[u32], cap: usize) -> Option<usize> {
    if weights.is_empty() || weights.len() > SCHEDULE_MAX_POSITIONS {
        return None;
    }
    let divisor = weights.iter().fold(0, |g, &w| gcd(g, w.max(1)));
    let len: u64 = weights.iter().map(|&w| u64::from(w.max(1) / divisor)).sum();
    (len <= cap as u64).then_some(len as usize)
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::wrr::SmoothWeights;

    fn picks(schedule: &Schedule, mut cursor: u32, count: usize) -> Vec<usize> {
        (0..count)
            .map(|_| schedule.pick(&mut cursor).unwrap())
            .collect()
    }

    /// The first `count` picks of worker `worker`'s credit scan over `weights`.
    fn scanned(weights: &[u32], worker: usize, count: usize) -> Vec<usize> {
        let mut smooth = SmoothWeights::for_worker(weights, worker);
        (0..count)
            .map(|_| smooth.next_position().unwrap())
            .collect()
    }

    #[test]
    fn the_cycle_is_divided_by_the_gcd() {
        let schedule = Schedule::of_weights(&[10, 20, 30]).unwrap();
        assert_eq!(schedule.cycle(), [2, 1, 0, 2, 1, 2]);
        assert_eq!(
            Schedule::of_weights(&[10; 4]).unwrap().cycle(),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn weights_beyond_the_cap_or_positions_do_not_fit() {
        let cap = SCHEDULE_CAP as u32;
        assert_eq!(cycle_len(&[cap]), Some(1));
        assert_eq!(cycle_len(&[cap - 1, 1]), Some(SCHEDULE_CAP));
        assert!(Schedule::of_weights(&[cap, 1]).is_none());
        assert!(Schedule::of_weights(&[1; SCHEDULE_MAX_POSITIONS + 1]).is_none());
        assert!(Schedule::of_weights(&[1; SCHEDULE_MAX_POSITIONS]).is_some());
        // Positions beyond a byte fit; 1,000 positions of weights 1 to 40 do not (20,500).
        assert_eq!(cycle_len(&[1; 300]), Some(300));
        let one_to_forty: Vec<u32> = (0..1000).map(|i| 1 + i % 40).collect();
        assert_eq!(cycle_len(&one_to_forty), None);
        assert!(Schedule::of_weights(&[]).is_none());
    }

    #[test]
    fn a_cycle_names_positions_beyond_a_byte() {
        // Weights 1 to 5 over 1,000 servers: a cycle of 3,000 entries naming all 1,000.
        let weights: Vec<u32> = (0..1000).map(|i| 1 + i % 5).collect();
        let schedule = Schedule::of_weights(&weights).unwrap();
        assert_eq!(schedule.len(), 3000);
        assert_eq!(schedule.cycle().iter().max(), Some(&999));
        let count = schedule.len() + 7;
        assert_eq!(picks(&schedule, 3, count), scanned(&weights, 3, count));
        // Every position once: the most a cycle names.
        let schedule = Schedule::of_weights(&[7; SCHEDULE_CAP]).unwrap();
        assert_eq!(
            schedule.cycle(),
            (0..SCHEDULE_CAP as u16).collect::<Vec<u16>>()
        );
    }

    #[test]
    fn a_rebuild_that_does_not_fit_leaves_no_cycle() {
        let mut schedule = Schedule::of_weights(&[1, 2]).unwrap();
        assert!(!schedule.rebuild(&[SCHEDULE_CAP as u32, 1]));
        assert!(schedule.is_empty());
        assert_eq!(schedule.pick(&mut 0), None);
    }

    #[test]
    fn a_cursor_beyond_the_cycle_is_taken_modulo_its_length() {
        let schedule = Schedule::of_weights(&[1, 1, 1]).unwrap();
        assert_eq!(picks(&schedule, 7, 4), [1, 2, 0, 1]);
        assert_eq!(picks(&schedule, u32::MAX, 2), [0, 1]);
    }

    proptest! {
        /// The whole point: a worker's picks from its schedule are its credit scan's.
        #[test]
        fn picks_are_the_credit_scans(
            weights in prop::collection::vec(0u32..15, 1..70),
            scale in 1u32..5,
            worker in 0usize..200,
        ) {
            let weights: Vec<u32> = weights.iter().map(|w| w * scale).collect();
            let schedule = Schedule::of_weights(&weights).unwrap();
            let count = 2 * schedule.len() + 3;
            prop_assert_eq!(picks(&schedule, worker as u32, count), scanned(&weights, worker, count));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Pools of hundreds of positions and few distinct weights, as awrr's buckets: the
        /// groups' picks are still the scan's, across every tie between groups.
        #[test]
        fn big_pools_of_few_weights_pick_as_the_credit_scan(
            weights in prop::collection::vec(2u32..=30, 100..600),
            worker in 0usize..50,
        ) {
            prop_assume!(cycle_len(&weights).is_some());
            let schedule = Schedule::of_weights(&weights).unwrap();
            let count = schedule.len() + 3;
            prop_assert_eq!(picks(&schedule, worker as u32, count), scanned(&weights, worker, count));
        }
    }
}
