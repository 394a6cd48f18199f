//! Token bucket for rate-limiting work the balancer does on its own initiative.
//!
//! Its first user is ICMP errors (e.g. "fragmentation needed"), which carry only the inner
//! headers of the packet that caused them, so the balancer cannot tell which server should
//! get them and copies them to all servers. A flood of ICMP errors would therefore be
//! amplified by the server count; the bucket caps that.
//!
//! # Exact integer accounting
//!
//! Credit is kept in *token-nanoseconds*: one token is worth [`NANOS_PER_SEC`] units, and
//! `elapsed_ns × rate_per_sec` units accrue over `elapsed_ns`. Refilling is therefore a
//! multiply and an add with no division and no rounding, so over any interval `T` the bucket
//! admits exactly `burst + ⌊rate × T⌋` events (at most), however often it is polled: no
//! floating-point drift and no lost fractional tokens from rounding each refill down.
//!
//! Time is passed in ([`Nanos`]). If `now` goes backwards (clocks of different workers,
//! replayed captures) the bucket simply does not refill and keeps its high-water mark of time,
//! so the interval is never credited twice.

use crate::types::{Nanos, NANOS_PER_SEC};

/// Admits on average `rate_per_sec` events per second, with bursts of up to `burst`.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate_per_sec: u64,
    burst: u64,
    /// Current credit in token-nanoseconds, `<= credit_cap`.
    credit: u64,
    /// `burst` tokens in token-nanoseconds (saturating; see [`TokenBucket::new`]).
    credit_cap: u64,
    /// Latest `now` seen; refills are measured from here.
    last_refill: Nanos,
}

/// Credit one event costs.
const TOKEN: u64 = NANOS_PER_SEC;

impl TokenBucket {
    /// A bucket that starts full (so the first `burst` events pass at once).
    ///
    /// `rate_per_sec == 0` admits the initial burst and then nothing; `burst == 0` admits
    /// nothing. Bursts above about 1.8 × 10¹⁰ tokens saturate the internal credit, which is
    /// far beyond any sensible configuration.
    pub fn new(rate_per_sec: u64, burst: u64) -> Self {
        let credit_cap = burst.saturating_mul(TOKEN);
        TokenBucket {
            rate_per_sec,
            burst,
            credit: credit_cap,
            credit_cap,
            last_refill: 0,
        }
    }

    pub fn rate_per_sec(&self) -> u64 {
        self.rate_per_sec
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whole tokens available at the last call (no refill is applied).
    pub fn available(&self) -> u64 {
        self.credit / TOKEN
    }

    /// Takes one token if there is one at `now`, refilling first for the time elapsed since
    /// the latest `now` seen. Returns whether the event may proceed.
    pub fn allow(&mut self, now: Nanos) -> bool {
        self.refill(now);
        if self.credit >= TOKEN {
            self.credit -= TOKEN;
            true
        } else {
            false
        }
    }

    fn refill(&mut self, now: Nanos) {
        if now <= self.last_refill {
            // Time went backwards or stood still: nothing accrues, and keeping the later
            // timestamp means the interval is not credited again when time catches up.
            return;
        }
        let elapsed = now - self.last_refill;
        self.last_refill = now;
        // Saturation can only happen after a gap long enough to fill the bucket anyway.
        let accrued = elapsed.saturating_mul(self.rate_per_sec);
        self.credit = self.credit.saturating_add(accrued).min(self.credit_cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::NANOS_PER_MS;
    use proptest::prelude::*;

    fn drain(bucket: &mut TokenBucket, now: Nanos) -> u64 {
        let mut admitted = 0;
        while bucket.allow(now) {
            admitted += 1;
        }
        admitted
    }

    #[test]
    fn starts_full_and_admits_exactly_the_burst() {
        let mut bucket = TokenBucket::new(10, 5);
        assert_eq!(bucket.available(), 5);
        assert_eq!(drain(&mut bucket, 1_000), 5);
        assert_eq!(bucket.available(), 0);
    }

    #[test]
    fn refills_at_the_configured_rate() {
        let mut bucket = TokenBucket::new(10, 5);
        drain(&mut bucket, 0);
        // One token per 100 ms.
        assert!(!bucket.allow(99 * NANOS_PER_MS));
        assert!(bucket.allow(100 * NANOS_PER_MS));
        assert!(!bucket.allow(100 * NANOS_PER_MS));
        assert_eq!(drain(&mut bucket, 350 * NANOS_PER_MS), 2);
    }

    #[test]
    fn refill_never_exceeds_the_burst() {
        let mut bucket = TokenBucket::new(1_000, 3);
        drain(&mut bucket, 0);
        assert_eq!(drain(&mut bucket, 3600 * NANOS_PER_SEC), 3);
    }

    #[test]
    fn time_going_backwards_does_not_refill_or_double_credit() {
        let mut bucket = TokenBucket::new(1, 1);
        assert_eq!(drain(&mut bucket, 10 * NANOS_PER_SEC), 1);
        // Back to 5 s: nothing accrues.
        assert!(!bucket.allow(5 * NANOS_PER_SEC));
        // Forward to 10.5 s: only 0.5 s has really passed since the token was taken.
        assert!(!bucket.allow(10 * NANOS_PER_SEC + NANOS_PER_SEC / 2));
        assert!(bucket.allow(11 * NANOS_PER_SEC));
    }

    #[test]
    fn fractional_credit_is_not_lost_between_frequent_polls() {
        // 7/s does not divide a millisecond evenly; polling every 1 ms for 100 s must admit
        // exactly 7 × 100 after the initial burst, not fewer from per-poll rounding.
        let mut bucket = TokenBucket::new(7, 2);
        let mut admitted = drain(&mut bucket, 0);
        for ms in 1..=100_000u64 {
            admitted += drain(&mut bucket, ms * NANOS_PER_MS);
        }
        assert_eq!(admitted, 2 + 700);
    }

    #[test]
    fn zero_rate_admits_only_the_initial_burst() {
        let mut bucket = TokenBucket::new(0, 2);
        assert_eq!(drain(&mut bucket, 0), 2);
        assert_eq!(drain(&mut bucket, u64::MAX), 0);
    }

    #[test]
    fn zero_burst_admits_nothing() {
        let mut bucket = TokenBucket::new(1_000_000, 0);
        assert_eq!(drain(&mut bucket, 0), 0);
        assert_eq!(drain(&mut bucket, 10 * NANOS_PER_SEC), 0);
    }

    #[test]
    fn huge_rates_and_gaps_saturate_instead_of_overflowing() {
        let mut bucket = TokenBucket::new(u64::MAX, 4);
        assert_eq!(drain(&mut bucket, 0), 4);
        assert_eq!(drain(&mut bucket, u64::MAX), 4);
        let mut unbounded = TokenBucket::new(1, u64::MAX);
        assert!(unbounded.allow(0));
    }

    proptest! {
        /// Over any sequence of (possibly non-monotonic) poll times, admissions never exceed
        /// `burst + ⌊rate × span⌋`, where span runs from 0 to the latest time seen.
        #[test]
        fn never_admits_more_than_burst_plus_rate_times_elapsed(
            rate in 0u64..2_000,
            burst in 0u64..20,
            times in proptest::collection::vec(0u64..5 * NANOS_PER_SEC, 1..300),
        ) {
            let mut bucket = TokenBucket::new(rate, burst);
            let mut admitted = 0u64;
            let mut latest = 0u64;
            for now in times {
                latest = latest.max(now);
                if bucket.allow(now) {
                    admitted += 1;
                }
                let bound = burst + (u128::from(rate) * u128::from(latest)
                    / u128::from(NANOS_PER_SEC)) as u64;
                prop_assert!(admitted <= bound, "admitted {} > bound {}", admitted, bound);
            }
        }
    }
}
