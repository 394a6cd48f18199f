//! Ring consistent hashing (Karger et al., STOC'97), the textbook "consistent hashing":
//! every server owns `vnodes` points on a 64-bit ring and a connection goes to the owner
//! of the first point at or after its hash, on every packet (no state).
//!
//! Unlike Maglev's table, which gives every server the same number of slots within one,
//! the arcs a server owns vary: with `v` points per server its share has a relative spread
//! of about `1/sqrt(v)`, which adds to the spread of the connections themselves. This is
//! the model behind the paper's remark that consistent hashing balances twice worse than
//! Beamer-like uniform hashing; the shipped policy (Maglev) does not have that defect.

use cheetah_core::policy::maglev::server_hash;
use cheetah_core::policy::PolicyRng;
use cheetah_core::ServerId;

use crate::conns::{Conn, ConnTable};
use crate::lbs::{LbModel, World};

const POINT_SEED: u64 = 0x6a09_e667_f3bc_c908;

pub struct Ring {
    vnodes: u32,
    /// `(point, server)`, sorted by point.
    points: Vec<(u64, u16)>,
}

impl Ring {
    pub fn new(vnodes: u32) -> Self {
        Ring {
            vnodes: vnodes.max(1),
            points: Vec::new(),
        }
    }

    fn build(&mut self, pool: &[ServerId]) {
        self.points.clear();
        for &server in pool {
            for vnode in 0..u64::from(self.vnodes) {
                let point = server_hash(
                    server.0,
                    POINT_SEED ^ vnode.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                );
                self.points.push((point, server.0));
            }
        }
        self.points.sort_unstable();
    }

    #[inline]
    fn lookup(&self, flow_hash: u64) -> ServerId {
        let index = self.points.partition_point(|&(point, _)| point < flow_hash);
        let (_, server) = self.points[if index == self.points.len() { 0 } else { index }];
        ServerId(server)
    }
}

impl LbModel for Ring {
    fn start(&mut self, world: &World) {
        self.build(world.pool);
    }

    fn place(&mut self, _world: &World, _rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        self.lookup(conn.flow_hash)
    }

    fn pool_changed(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.build(world.pool);
        for (slot, conn) in conns.iter() {
            if self.lookup(conn.flow_hash) != conn.server {
                broken.push(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_a_server_moves_only_its_arcs() {
        let pool: Vec<ServerId> = (0..10).map(ServerId).collect();
        let mut ring = Ring::new(50);
        ring.build(&pool);
        let hashes: Vec<u64> = (0..10_000u64).map(|i| server_hash(0, i)).collect();
        let before: Vec<ServerId> = hashes.iter().map(|&h| ring.lookup(h)).collect();
        let smaller: Vec<ServerId> = pool.iter().copied().filter(|id| id.0 != 3).collect();
        ring.build(&smaller);
        for (&hash, &old) in hashes.iter().zip(&before) {
            if old != ServerId(3) {
                assert_eq!(ring.lookup(hash), old);
            }
        }
    }
}
