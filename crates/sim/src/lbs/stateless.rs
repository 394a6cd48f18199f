//! The stateless baselines, which place every packet afresh with a core policy:
//!
//! - **Plain hashing (ECMP)**: `pool[hash % n]`, the core's [`pick_modulo`]. Nothing
//!   remembers a connection, so any change of `n` remaps almost every connection: a removed
//!   server's connections and most of everyone else's.
//! - **Maglev used statelessly**: every packet is looked up in the current table (the
//!   core's `MaglevTable`). A pool change remaps the removed server's connections and,
//!   because the table is rebuilt from scratch, a small share of everyone else's (about
//!   1-2% of the slots in the core's tests).
//!
//! New connections go through the core's `Hash` / `Maglev` policy itself; a pool change
//! breaks every connection whose packets the new pool would send elsewhere.

use cheetah_core::policy::hash::pick_modulo;
use cheetah_core::policy::{self, LoadMetric, Policy, PolicyKind, PolicyRng, PoolSnapshot};
use cheetah_core::ServerId;

use crate::conns::{Conn, ConnTable};
use crate::lbs::{pick_with, LbModel, World};

pub struct Stateless {
    kind: PolicyKind,
    snapshot: PoolSnapshot,
    policy: Box<dyn Policy>,
}

impl Stateless {
    /// `kind` is `PolicyKind::Hash` or `PolicyKind::Maglev`.
    pub fn new(kind: PolicyKind) -> Self {
        assert!(
            matches!(kind, PolicyKind::Hash | PolicyKind::Maglev),
            "not a stateless baseline: {kind:?}"
        );
        let snapshot = PoolSnapshot::new(
            Vec::new(),
            Vec::new(),
            LoadMetric::ActiveConnections,
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        );
        let policy = policy::build(kind, &snapshot, 0, 1);
        Stateless {
            kind,
            snapshot,
            policy,
        }
    }

    /// Where the current pool sends a packet of this flow.
    fn route(&self, world: &World, flow_hash: u64) -> Option<ServerId> {
        match self.kind {
            PolicyKind::Hash => pick_modulo(world.pool, flow_hash),
            _ => self.snapshot.maglev.lookup(flow_hash),
        }
    }
}

impl LbModel for Stateless {
    fn start(&mut self, world: &World) {
        self.snapshot = PoolSnapshot::new(
            world.pool.to_vec(),
            world.weights.to_vec(),
            LoadMetric::ActiveConnections,
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        );
    }

    fn place(&mut self, world: &World, rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        pick_with(
            self.policy.as_mut(),
            &self.snapshot,
            world,
            rng,
            conn.flow_hash,
        )
    }

    fn pool_changed(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.start(world);
        for (slot, conn) in conns.iter() {
            if self.route(world, conn.flow_hash) != Some(conn.server) {
                broken.push(slot);
            }
        }
    }
}
