//! A stateful LB tier behind ECMP, as Katran and Maglev deploy it (paper section 2.2).
//!
//! Each LB instance keeps a connection table. A new connection is placed by Maglev over the
//! current pool and remembered by the instance ECMP sent it to; later packets that reach
//! an instance with state follow it, so server changes alone break nothing. When the set
//! of instances changes, the first-tier routers' ECMP (modulo hashing over the announced
//! instances) moves connections to instances without their state; such an instance falls
//! back to Maglev over the *current* pool, which breaks the connection if the pool changed
//! under it since it started (the paper: "it will hash the connection to the wrong
//! server, thus breaking PCC"). An instance that takes over a connection it can place
//! correctly adds it to its table. A removed instance loses its table.
//!
//! `Conn::aux` holds the set of instances (ids below 64) that know the connection.

use cheetah_core::policy::maglev::server_hash;
use cheetah_core::policy::{MaglevTable, PolicyRng};
use cheetah_core::ServerId;

use crate::conns::{Conn, ConnTable};
use crate::lbs::{LbModel, World};

/// Seed of the routers' ECMP hash, so that it is independent of the LBs' own hash.
const ECMP_SEED: u64 = 0x5bd1_e995_0000_ecec;

/// The instance ECMP sends `flow_hash` to: modulo hashing over the announced instances, as
/// plain ECMP in the first-tier routers does.
#[inline]
pub fn ecmp_instance(flow_hash: u64, instances: &[u8]) -> u8 {
    let mixed = server_hash(0, flow_hash ^ ECMP_SEED);
    instances[(mixed % instances.len() as u64) as usize]
}

#[inline]
pub fn instance_bit(instance: u8) -> u64 {
    1u64 << instance
}

/// Moves connections to the instances ECMP now picks and reports those that break.
///
/// Instances no longer announced forget their state. A connection reaching an
/// instance without its state is looked up in `maglev` (the current pool's table); it
/// survives only if that gives its server. With `fallback_only`, connections whose client
/// sends TCP timestamps are skipped (cheetah routes those by cookie).
pub fn rehome(
    world: &World,
    conns: &mut ConnTable,
    maglev: &MaglevTable,
    fallback_only: bool,
    broken: &mut Vec<u32>,
) {
    let announced = world
        .lb_instances
        .iter()
        .fold(0u64, |set, &id| set | instance_bit(id));
    for (slot, conn) in conns.iter_mut() {
        if fallback_only && conn.timestamps {
            continue;
        }
        conn.aux &= announced;
        let instance = instance_bit(ecmp_instance(conn.flow_hash, world.lb_instances));
        if conn.aux & instance != 0 {
            continue;
        }
        if maglev.lookup(conn.flow_hash) == Some(conn.server) {
            conn.aux |= instance;
        } else {
            broken.push(slot);
        }
    }
}

#[derive(Default)]
pub struct StatefulMaglev {
    table: Option<MaglevTable>,
}

impl StatefulMaglev {
    fn table(&self) -> &MaglevTable {
        self.table.as_ref().expect("started")
    }
}

impl LbModel for StatefulMaglev {
    fn start(&mut self, world: &World) {
        self.table = Some(MaglevTable::build(
            world.pool,
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        ));
    }

    fn place(&mut self, world: &World, _rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        conn.aux = instance_bit(ecmp_instance(conn.flow_hash, world.lb_instances));
        self.table()
            .lookup(conn.flow_hash)
            .expect("the pool is never empty")
    }

    fn pool_changed(&mut self, world: &World, _conns: &mut ConnTable, _broken: &mut Vec<u32>) {
        // Every instance still has the state of the connections it sees.
        self.table = Some(MaglevTable::build(
            world.pool,
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        ));
    }

    fn lb_instances_changed(
        &mut self,
        world: &World,
        _old: &[u8],
        conns: &mut ConnTable,
        broken: &mut Vec<u32>,
    ) {
        let table = self.table.take().expect("started");
        rehome(world, conns, &table, false, broken);
        self.table = Some(table);
    }
}
