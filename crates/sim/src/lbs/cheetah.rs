//! Stateless cheetah (paper section 3.1): the VIP's policy places each new connection and
//! the cookie in the TCP timestamp carries the choice, so no change of the server pool or
//! of the LB instances can send a later packet elsewhere.
//!
//! The model calls the core's own code: the pool is a [`PoolSnapshot`] rebuilt whenever the
//! pool changes (as the control plane publishes one), the policy instance comes from
//! [`cheetah_core::policy::build`], and picks go through [`Policy::pick`] with a
//! [`LoadView`](cheetah_core::policy::LoadView) holding the simulated active connections.
//! AWRR gets the servers' reported loads and [`Policy::on_loads_merged`] every
//! [`MERGE_INTERVAL`], as a worker does.
//!
//! Clients without TCP timestamps cannot carry a cookie. Like the pipeline
//! (`lb/fallback.rs`, docs/design.md), the model places them with the pool's Maglev table
//! and remembers them in the LB instance's fallback table: they survive server changes while their
//! instance keeps them, and break like a stateful LB's connections when ECMP moves them to
//! an instance that does not know them and Maglev has changed meanwhile. The table is
//! modelled without eviction (1M entries per LB instance hold every run here).

use cheetah_core::policy::{
    self, LoadMetric, Policy, PolicyKind, PolicyRng, PoolSnapshot, MERGE_INTERVAL,
};
use cheetah_core::{Nanos, ServerId};

use crate::conns::{Conn, ConnTable};
use crate::lbs::stateful::{ecmp_instance, instance_bit, rehome};
use crate::lbs::{pick_with, LbModel, World};

pub struct Cheetah {
    kind: PolicyKind,
    snapshot: PoolSnapshot,
    policy: Box<dyn Policy>,
}

impl Cheetah {
    pub fn new(kind: PolicyKind) -> Self {
        let snapshot = PoolSnapshot::new(
            Vec::new(),
            Vec::new(),
            kind.default_metric(),
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        );
        let policy = policy::build(kind, &snapshot, 0, 1);
        Cheetah {
            kind,
            snapshot,
            policy,
        }
    }

    /// Publishes a new snapshot and rebuilds the policy instance, as the control plane does.
    fn rebuild(&mut self, world: &World) {
        self.snapshot = PoolSnapshot::new(
            world.pool.to_vec(),
            world.weights.to_vec(),
            self.kind.default_metric(),
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        );
        self.policy = policy::build(self.kind, &self.snapshot, 0, 1);
        self.policy.on_loads_merged(&self.snapshot, world.loads);
    }

    pub fn metric(&self) -> LoadMetric {
        self.snapshot.metric
    }
}

impl LbModel for Cheetah {
    fn start(&mut self, world: &World) {
        self.rebuild(world);
    }

    fn place(&mut self, world: &World, rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        if !conn.timestamps {
            conn.aux = instance_bit(ecmp_instance(conn.flow_hash, world.lb_instances));
            return self
                .snapshot
                .maglev
                .lookup(conn.flow_hash)
                .expect("the pool is never empty");
        }
        pick_with(
            self.policy.as_mut(),
            &self.snapshot,
            world,
            rng,
            conn.flow_hash,
        )
    }

    fn pool_changed(&mut self, world: &World, _conns: &mut ConnTable, _broken: &mut Vec<u32>) {
        // Cookie connections are never remapped, fallback ones stay in their table.
        self.rebuild(world);
    }

    fn lb_instances_changed(
        &mut self,
        world: &World,
        _old: &[u8],
        conns: &mut ConnTable,
        broken: &mut Vec<u32>,
    ) {
        rehome(world, conns, &self.snapshot.maglev, true, broken);
    }

    fn tick_interval(&self) -> Option<Nanos> {
        (self.kind == PolicyKind::AutoWeightedRoundRobin).then_some(MERGE_INTERVAL)
    }

    fn uses_reported_load(&self) -> bool {
        self.kind.default_metric() == LoadMetric::Reported
    }

    fn tick(&mut self, world: &World, _conns: &mut ConnTable, _broken: &mut Vec<u32>) {
        self.policy.on_loads_merged(&self.snapshot, world.loads);
    }
}
