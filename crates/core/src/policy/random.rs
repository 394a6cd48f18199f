//! Uniform random choice: every pool member is equally likely, independent of load.

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

use crate::policy::{PickContext, Policy, PolicyKind, PolicyRng};
use crate::types::ServerId;

/// Picks a uniformly random pool member with the caller's seeded generator.
pub struct Random;

impl Policy for Random {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    #[inline]
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId> {
        let servers = &ctx.pool.servers;
        if servers.is_empty() {
            return None;
        }
        Some(servers[uniform_below(ctx.rng, servers.len())])
    }
}

/// The Xoshiro256++ state words of `PolicyRng::seed_from_u64(seed)`, for a generator kept
/// elsewhere (the XDP program's, per CPU) that must draw what this one draws:
/// `seed_from_u64` fills the state from SplitMix64, as little-endian words.
pub fn rng_state(seed: u64) -> [u64; 4] {
    let mut bytes = [0u8; 32];
    SplitMix64::seed_from_u64(seed).fill_bytes(&mut bytes);
    std::array::from_fn(|i| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap()))
}

/// A uniformly distributed integer in `0..bound` (`bound > 0`), without modulo bias.
///
/// Lemire's multiply-and-reject method ("Fast random integer generation in an interval",
/// 2019): one 64-bit multiplication, and a division only in the rare case where the draw
/// lands in the biased low range.
#[inline]
pub fn uniform_below(rng: &mut PolicyRng, bound: usize) -> usize {
    debug_assert!(bound > 0);
    let bound = bound as u64;
    let mut product = u128::from(rng.next_u64()) * u128::from(bound);
    if (product as u64) < bound {
        // 2^64 mod bound: the draws below it would make low results one more likely.
        let biased = bound.wrapping_neg() % bound;
        while (product as u64) < biased {
            product = u128::from(rng.next_u64()) * u128::from(bound);
        }
    }
    (product >> 64) as usize
}

#[cfg(test)]
mod tests {
    use rand_core::SeedableRng;

    use super::*;
    use crate::policy::testing::{counts, picks, pool};
    use crate::policy::LoadView;

    #[test]
    fn covers_every_server_about_equally() {
        let counts = counts(
            &picks(&mut Random, &pool(10), &LoadView::new(), 7, 100_000),
            10,
        );
        // Expected 10_000 each, standard deviation ~95.
        assert!(
            counts.iter().all(|&c| (9_500..=10_500).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn same_seed_replays_the_same_picks() {
        let (pool, loads) = (pool(5), LoadView::new());
        assert_eq!(
            picks(&mut Random, &pool, &loads, 3, 100),
            picks(&mut Random, &pool, &loads, 3, 100)
        );
        assert_ne!(
            picks(&mut Random, &pool, &loads, 3, 100),
            picks(&mut Random, &pool, &loads, 4, 100)
        );
    }

    #[test]
    fn uniform_below_has_no_modulo_bias() {
        // With bound = 3 * 2^62, `next_u64() % bound` would make the lowest third twice as
        // likely as each other third; the rejection step must remove that.
        let bound = 3usize << 62;
        let mut rng = PolicyRng::seed_from_u64(11);
        let draws = 60_000;
        let low = (0..draws)
            .filter(|_| uniform_below(&mut rng, bound) < bound / 3)
            .count();
        // Expected a third (20_000), standard deviation ~115; modulo would give ~30_000.
        assert!((19_400..=20_600).contains(&low), "{low}");
    }

    #[test]
    fn rng_state_is_the_state_seed_from_u64_starts_in() {
        for seed in [0, 1, 0x5eed_0000, u64::MAX] {
            let state = rng_state(seed);
            let mut bytes = [0u8; 32];
            for (i, word) in state.iter().enumerate() {
                bytes[8 * i..8 * i + 8].copy_from_slice(&word.to_le_bytes());
            }
            let mut copy = PolicyRng::from_seed(bytes);
            let mut original = PolicyRng::seed_from_u64(seed);
            for _ in 0..100 {
                assert_eq!(copy.next_u64(), original.next_u64(), "seed {seed}");
            }
        }
    }

    #[test]
    fn uniform_below_one_is_zero() {
        let mut rng = PolicyRng::seed_from_u64(0);
        assert!((0..100).all(|_| uniform_below(&mut rng, 1) == 0));
    }
}
