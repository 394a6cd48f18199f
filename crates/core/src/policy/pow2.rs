//! Power of two choices (Mitzenmacher): draw two distinct servers at random, take the
//! less loaded one.
//!
//! Comparing only two random servers avoids least-loaded's herd effect (every worker
//! sending everything to the same momentarily idlest server until the next load update)
//! while still cutting the maximum imbalance exponentially compared with one random choice.

use crate::policy::random::uniform_below;
use crate::policy::{PickContext, Policy, PolicyKind, PolicyRng};
use crate::types::ServerId;

pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::PowerOfTwo
    }

    /// On equal loads the first drawn server wins, which is itself uniformly random.
    #[inline]
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId> {
        let servers = &ctx.pool.servers;
        match servers.len() {
            0 => None,
            1 => Some(servers[0]),
            n => {
                let (first, second) = draw_two_positions(ctx.rng, n);
                let (first, second) = (servers[first], servers[second]);
                let metric = ctx.pool.metric;
                if ctx.loads.load(second, metric) < ctx.loads.load(first, metric) {
                    Some(second)
                } else {
                    Some(first)
                }
            }
        }
    }
}

/// Two distinct uniformly random positions in `0..n` (`n >= 2`), in drawing order.
#[inline]
fn draw_two_positions(rng: &mut PolicyRng, n: usize) -> (usize, usize) {
    let first = uniform_below(rng, n);
    // Uniform among the n - 1 other positions: a draw that hits `first` stands for n - 1.
    let second = uniform_below(rng, n - 1);
    (first, if second == first { n - 1 } else { second })
}

#[cfg(test)]
mod tests {
    use rand_core::SeedableRng;

    use super::*;
    use crate::policy::testing::{counts, picks, pool};
    use crate::policy::{LoadMetric, LoadView};

    #[test]
    fn picks_the_less_loaded_of_the_two_drawn() {
        let pool = pool(6);
        let mut loads = LoadView::new();
        for (id, load) in pool.servers.iter().zip([5.0, 1.0, 4.0, 2.0, 6.0, 3.0]) {
            loads.set_load(*id, LoadMetric::ActiveConnections, load);
        }
        let mut rng = PolicyRng::seed_from_u64(99);
        for _ in 0..1000 {
            // Replay the draws the pick is about to make.
            let (first, second) = draw_two_positions(&mut rng.clone(), 6);
            assert_ne!(first, second);
            let lighter = if loads.load(ServerId(second as u16), LoadMetric::ActiveConnections)
                < loads.load(ServerId(first as u16), LoadMetric::ActiveConnections)
            {
                second
            } else {
                first
            };
            let mut ctx = PickContext {
                pool: &pool,
                flow_hash: 0,
                loads: &loads,
                rng: &mut rng,
                now: 0,
            };
            assert_eq!(PowerOfTwo.pick(&mut ctx), Some(ServerId(lighter as u16)));
        }
    }

    #[test]
    fn never_picks_the_busier_of_two_servers() {
        let pool = pool(2);
        let mut loads = LoadView::new();
        loads.set_load(ServerId(0), LoadMetric::ActiveConnections, 3.0);
        loads.set_load(ServerId(1), LoadMetric::ActiveConnections, 2.0);
        assert!(picks(&mut PowerOfTwo, &pool, &loads, 5, 500)
            .iter()
            .all(|&id| id == ServerId(1)));
    }

    #[test]
    fn the_busiest_server_never_wins() {
        let pool = pool(5);
        let mut loads = LoadView::new();
        loads.set_load(ServerId(3), LoadMetric::ActiveConnections, 9.0);
        let counts = counts(&picks(&mut PowerOfTwo, &pool, &loads, 8, 4000), 5);
        assert_eq!(counts[3], 0);
        assert!(
            counts.iter().enumerate().all(|(id, &c)| id == 3 || c > 800),
            "{counts:?}"
        );
    }

    #[test]
    fn ties_go_to_the_first_drawn_so_equal_loads_spread_uniformly() {
        let pool = pool(4);
        let counts = counts(
            &picks(&mut PowerOfTwo, &pool, &LoadView::new(), 1, 40_000),
            4,
        );
        assert!(
            counts.iter().all(|&c| (9_500..=10_500).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn second_draw_is_uniform_over_the_other_positions() {
        let mut rng = PolicyRng::seed_from_u64(4);
        let mut pairs = [[0usize; 3]; 3];
        for _ in 0..30_000 {
            let (first, second) = draw_two_positions(&mut rng, 3);
            pairs[first][second] += 1;
        }
        for (first, row) in pairs.iter().enumerate() {
            for (second, &count) in row.iter().enumerate() {
                if first == second {
                    assert_eq!(count, 0);
                } else {
                    assert!((4_600..=5_400).contains(&count), "{pairs:?}");
                }
            }
        }
    }

    #[test]
    fn single_server_pool_always_picks_it() {
        let pool = pool(1);
        assert!(picks(&mut PowerOfTwo, &pool, &LoadView::new(), 0, 10)
            .iter()
            .all(|&id| id == ServerId(0)));
    }
}
