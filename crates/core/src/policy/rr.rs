//! Round-robin: each worker walks the pool in order, one server per new connection.

use crate::policy::{PickContext, Policy, PolicyKind, PoolSnapshot};
use crate::types::ServerId;

/// A per-worker cursor over the pool.
///
/// Worker `w` starts at pool position `w % n`, so that workers which all start together do
/// not all send their first connections to the first server.
pub struct RoundRobin {
    cursor: usize,
}

impl RoundRobin {
    pub fn new(pool: &PoolSnapshot, worker: usize, _workers: usize) -> Self {
        RoundRobin {
            cursor: worker.checked_rem(pool.servers.len()).unwrap_or(0),
        }
    }
}

impl RoundRobin {
    /// The pool position the next pick takes (if it is in the pool): the state a copy of
    /// this instance elsewhere (the XDP program's, per CPU) starts from.
    pub fn cursor(&self) -> usize {
        self.cursor
    }
}

impl Policy for RoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::RoundRobin
    }

    #[inline]
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId> {
        let servers = &ctx.pool.servers;
        if servers.is_empty() {
            return None;
        }
        // Only a policy used with another pool than it was built for can be out of range.
        let position = if self.cursor < servers.len() {
            self.cursor
        } else {
            0
        };
        self.cursor = if position + 1 == servers.len() {
            0
        } else {
            position + 1
        };
        Some(servers[position])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{counts, picks, pool};
    use crate::policy::LoadView;

    #[test]
    fn every_server_exactly_k_times_in_k_rounds() {
        let loads = LoadView::new();
        for n in [1u16, 2, 5, 13] {
            let pool = pool(n);
            for worker in 0..4 {
                let mut rr = RoundRobin::new(&pool, worker, 4);
                let picked = picks(&mut rr, &pool, &loads, 0, 7 * n as usize);
                assert_eq!(
                    counts(&picked, n as usize),
                    vec![7; n as usize],
                    "n={n} worker={worker}"
                );
            }
        }
    }

    #[test]
    fn workers_start_at_their_own_index_and_step_by_one() {
        let pool = pool(3);
        let loads = LoadView::new();
        let expected = [[0, 1, 2, 0], [1, 2, 0, 1], [2, 0, 1, 2], [0, 1, 2, 0]];
        for (worker, expected) in expected.iter().enumerate() {
            let mut rr = RoundRobin::new(&pool, worker, 4);
            let picked: Vec<u16> = picks(&mut rr, &pool, &loads, 0, 4)
                .iter()
                .map(|s| s.0)
                .collect();
            assert_eq!(picked, expected, "worker {worker}");
        }
    }
}
