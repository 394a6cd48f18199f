//! Maglev consistent hashing used statelessly: every packet is looked up in the current
//! table (the core's [`MaglevTable`], placed through the core's `Maglev` policy). A pool
//! change remaps the removed server's connections and, because the table is rebuilt from
//! scratch, a small share of everyone else's (about 1-2% of the slots in the core's tests).

use cheetah_core::policy::{
    self, LoadMetric, PickContext, Policy, PolicyKind, PolicyRng, PoolSnapshot,
};
use cheetah_core::ServerId;

use crate::conns::{Conn, ConnTable};
use crate::lbs::{LbModel, World};

pub struct StatelessMaglev {
    snapshot: PoolSnapshot,
    policy: Box<dyn Policy>,
}

impl Default for StatelessMaglev {
    fn default() -> Self {
        let snapshot = PoolSnapshot::new(Vec::new(), Vec::new(), LoadMetric::ActiveConnections);
        let policy = policy::build(PolicyKind::Maglev, &snapshot, 0, 1);
        StatelessMaglev { snapshot, policy }
    }
}

impl LbModel for StatelessMaglev {
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
            if self.snapshot.maglev.lookup(conn.flow_hash) != Some(conn.server) {
                broken.push(slot);
            }
        }
    }
}
