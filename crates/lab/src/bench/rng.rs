//! The trace's random source: SplitMix64, seeded.
//!
//! Why not the OS RNG or a crate: the trace must be the same bytes on every run and every
//! machine, so that two runs (or a timing run and its callgrind re-execution) measure the
//! same packets, and SplitMix64 is ten lines with no dependency to pin.

pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift (bias below 2^-32 for our `n`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// One entry of a weighted list (weights need not sum to 1).
    pub fn weighted<T: Copy>(&mut self, choices: &[(T, f64)]) -> T {
        let total: f64 = choices.iter().map(|(_, w)| w).sum();
        let mut x = self.unit() * total;
        for &(choice, weight) in choices {
            if x < weight {
                return choice;
            }
            x -= weight;
        }
        choices[choices.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        assert!((0..1000).all(|_| a.below(10) < 10));
    }
}
