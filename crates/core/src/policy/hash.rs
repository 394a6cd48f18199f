//! Plain hashing: `pool[flow_hash % n]`, the baseline of ECMP-style load balancers.
//!
//! Stateless and identical on every worker, but a pool change remaps almost every
//! connection (use Maglev when that matters) and the spread is only as even as the hash.

use crate::policy::{PickContext, Policy, PolicyKind};
use crate::types::ServerId;

pub struct HashPolicy;

/// `servers[flow_hash % n]`; shared with the plain-hash baseline mode of the pipeline.
#[inline]
pub fn pick_modulo(servers: &[ServerId], flow_hash: u64) -> Option<ServerId> {
    if servers.is_empty() {
        return None;
    }
    Some(servers[(flow_hash % servers.len() as u64) as usize])
}

impl Policy for HashPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Hash
    }

    #[inline]
    fn pick(&mut self, ctx: &mut PickContext<'_>) -> Option<ServerId> {
        pick_modulo(&ctx.pool.servers, ctx.flow_hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{picks, pool};
    use crate::policy::LoadView;

    #[test]
    fn picks_pool_position_hash_mod_n() {
        let pool = pool(7);
        // `picks` uses flow hashes 0, 1, 2...
        let picked = picks(&mut HashPolicy, &pool, &LoadView::new(), 0, 21);
        for (hash, server) in picked.iter().enumerate() {
            assert_eq!(*server, pool.servers[hash % 7]);
        }
    }

    #[test]
    fn same_hash_same_server_on_every_worker() {
        let pool = pool(5);
        let loads = LoadView::new();
        assert_eq!(
            picks(&mut HashPolicy, &pool, &loads, 1, 50),
            picks(&mut HashPolicy, &pool, &loads, 2, 50)
        );
    }
}
