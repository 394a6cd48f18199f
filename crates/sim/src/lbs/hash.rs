//! Plain hashing, the ECMP baseline: every packet goes to `pool[hash % n]`, computed by the
//! core's [`pick_modulo`] (new connections go through the core's `Hash` policy itself).
//! Nothing remembers a connection, so any change of `n` remaps almost every connection:
//! a removed server's connections and most of everyone else's.

use cheetah_core::policy::hash::pick_modulo;
use cheetah_core::policy::{
    self, LoadMetric, PickContext, Policy, PolicyKind, PolicyRng, PoolSnapshot,
};
use cheetah_core::ServerId;

use crate::conns::{Conn, ConnTable};
use crate::lbs::{LbModel, World};

pub struct PlainHash {
    snapshot: PoolSnapshot,
    policy: Box<dyn Policy>,
}

impl Default for PlainHash {
    fn default() -> Self {
        let snapshot = PoolSnapshot::new(Vec::new(), Vec::new(), LoadMetric::ActiveConnections);
        let policy = policy::build(PolicyKind::Hash, &snapshot, 0, 1);
        PlainHash { snapshot, policy }
    }
}

impl LbModel for PlainHash {
    fn start(&mut self, world: &World) {
        self.snapshot = PoolSnapshot::new(
            world.pool.to_vec(),
            world.weights.to_vec(),
            LoadMetric::ActiveConnections,
        );
    }

    fn place(&mut self, world: &World, rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        let mut ctx = PickContext {
            pool: &self.snapshot,
            flow_hash: conn.flow_hash,
            loads: world.loads,
            rng,
            now: world.now,
        };
        self.policy.pick(&mut ctx).expect("the pool is never empty")
    }

    fn pool_changed(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.start(world);
        for (slot, conn) in conns.iter() {
            if pick_modulo(world.pool, conn.flow_hash) != Some(conn.server) {
                broken.push(slot);
            }
        }
    }
}
