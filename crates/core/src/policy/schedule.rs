//! Smooth weighted round-robin as a precomputed cycle, so that a pick costs one read
//! instead of a scan of the pool.
//!
//! [`SmoothWeights`] from zero credits is periodic: after `total` picks (the sum of the
//! weights) every server has been picked exactly its weight's times and every credit is
//! back to zero. Scaling every weight by `k` scales every credit by `k` and changes no
//! comparison, so the weights divided by their gcd give the same picks with a shorter
//! period. A [`Schedule`] is that shortest period written out as pool positions, and
//! `SmoothWeights::for_worker(weights, w)`'s i-th pick is `cycle[(w + i) % len]`.
//!
//! The cycle is built where the weights change (a snapshot for wrr, a merge for awrr) and
//! read per pick, by the core's workers and, as the same 16-bit positions, by the XDP
//! program (docs/dataplane.md "Schedules"). The cycle has at most [`SCHEDULE_CAP`] entries,
//! so it names at most that many positions (each server is picked at least once a cycle);
//! weights beyond it keep the credit scan. Writing a cycle out costs its length times the
//! pool's size in steps, at most `SCHEDULE_CAP`^2.

use crate::policy::wrr::SmoothWeights;

/// Most entries of a cycle (after dividing by the gcd): 8 KiB of positions per VIP, which
/// holds any awrr cycle of the kernel's pools (136 servers of at most 30 buckets).
pub const SCHEDULE_CAP: usize = 4096;
/// Most pool positions a cycle can name: a cycle of at most [`SCHEDULE_CAP`] entries picks
/// every position at least once, so no more than that many.
pub const SCHEDULE_MAX_POSITIONS: usize = SCHEDULE_CAP;
// Positions are u16.
const _: () = assert!(SCHEDULE_MAX_POSITIONS <= u16::MAX as usize + 1);

/// One cycle of smooth-WRR picks from zero credits, as pool positions.
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    cycle: Vec<u16>,
    /// The credit scan that writes the cycle out, kept so a rebuild reuses its buffers.
    builder: Option<SmoothWeights>,
}

impl Schedule {
    /// The cycle of `weights` (one per pool position; 0 counts as 1, as in
    /// [`SmoothWeights`]), or `None` if it does not fit.
    pub fn of_weights(weights: &[u32]) -> Option<Schedule> {
        let mut schedule = Schedule::default();
        schedule.rebuild(weights).then_some(schedule)
    }

    /// Replaces the cycle by `weights`'s, reusing the buffers; `false` (and an empty
    /// cycle) if it does not fit.
    pub fn rebuild(&mut self, weights: &[u32]) -> bool {
        self.cycle.clear();
        let Some(len) = cycle_len(weights) else {
            return false;
        };
        let divisor = weights.iter().fold(0, |g, &w| gcd(g, w.max(1)));
        let reduced = weights.iter().map(|&w| w.max(1) / divisor);
        let builder = self.builder.get_or_insert_with(|| SmoothWeights::new(&[]));
        builder.restart(reduced);
        self.cycle
            .extend((0..len).map_while(|_| builder.next_position().map(|p| p as u16)));
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

/// The length of `weights`'s cycle if it fits a [`Schedule`]: the sum of the weights
/// divided by their gcd.
pub fn cycle_len(weights: &[u32]) -> Option<usize> {
    if weights.is_empty() || weights.len() > SCHEDULE_MAX_POSITIONS {
        return None;
    }
    let divisor = weights.iter().fold(0, |g, &w| gcd(g, w.max(1)));
    let len: u64 = weights.iter().map(|&w| u64::from(w.max(1) / divisor)).sum();
    (len <= SCHEDULE_CAP as u64).then_some(len as usize)
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

    fn picks(schedule: &Schedule, mut cursor: u32, count: usize) -> Vec<usize> {
        (0..count)
            .map(|_| schedule.pick(&mut cursor).unwrap())
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
        assert_eq!(cycle_len(&[4096]), Some(1));
        assert_eq!(cycle_len(&[4095, 1]), Some(4096));
        assert!(Schedule::of_weights(&[4096, 1]).is_none());
        assert!(Schedule::of_weights(&[1; SCHEDULE_MAX_POSITIONS + 1]).is_none());
        assert!(Schedule::of_weights(&[1; SCHEDULE_MAX_POSITIONS]).is_some());
        // Positions beyond a byte fit; 1,000 positions of weights 1 to 9 do not (4,996).
        assert_eq!(cycle_len(&[1; 300]), Some(300));
        let one_to_nine: Vec<u32> = (0..1000).map(|i| 1 + i % 9).collect();
        assert_eq!(cycle_len(&one_to_nine), None);
        assert!(Schedule::of_weights(&[]).is_none());
    }

    #[test]
    fn a_cycle_names_positions_beyond_a_byte() {
        // Weights 1 to 5 over 1,000 servers: a cycle of 3,000 entries naming all 1,000.
        let weights: Vec<u32> = (0..1000).map(|i| 1 + i % 5).collect();
        let schedule = Schedule::of_weights(&weights).unwrap();
        assert_eq!(schedule.len(), 3000);
        assert_eq!(schedule.cycle().iter().max(), Some(&999));
        let mut smooth = SmoothWeights::for_worker(&weights, 3);
        let count = schedule.len() + 7;
        let scanned: Vec<usize> = (0..count)
            .map(|_| smooth.next_position().unwrap())
            .collect();
        assert_eq!(picks(&schedule, 3, count), scanned);
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
        assert!(!schedule.rebuild(&[5000, 1]));
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
            let mut smooth = SmoothWeights::for_worker(&weights, worker);
            let count = 2 * schedule.len() + 3;
            let scanned: Vec<usize> = (0..count).map(|_| smooth.next_position().unwrap()).collect();
            prop_assert_eq!(picks(&schedule, worker as u32, count), scanned);
        }
    }
}
