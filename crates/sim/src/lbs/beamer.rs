//! Beamer (Olteanu et al., NSDI'18) and the paper's dynamic variant (figure 2c).
//!
//! Rules modelled:
//!
//! * A connection's packets go to its bucket's current server (`bucket = hash mod B`,
//!   `B` = 100 buckets per server, Beamer's recommendation for even spread).
//! * Daisy chaining: the mux also carries the bucket's previous server and the time of
//!   the change; a server without state for a mid-connection packet forwards it there. A
//!   connection survives if it is on the bucket's current or previous server.
//! * One previous server per bucket: a bucket that changes twice while connections of its
//!   first owner are open breaks them (paper section 2.1, condition (i)).
//! * The previous server is forgotten `timeout` after the change (we default to 240 s;
//!   Beamer leaves the value to the operator), which breaks connections still on it.
//! * Without daisy chaining (figure 2a's other line) only the current server counts.
//!
//! The dynamic variant ("we extended Beamer with a dynamic mechanism that gets as input an
//! imbalance threshold and remove a server from the indirection table whenever its load is
//! above this threshold. The server is re-added to the table when its number of active
//! connections drops below the average") checks loads every `check_interval` (100 ms,
//! fine enough to see micro-bursts). Each check puts back every excluded server now below
//! the average and takes out at most one server, the busiest above the threshold: the
//! paper does not say how many, and taking out all of them at once makes the shed buckets
//! overload the next servers in a cascade that empties the table. A server taken out of
//! the table stays in the pool and keeps its connections.

use std::collections::VecDeque;

use cheetah_core::policy::PolicyRng;
use cheetah_core::{Nanos, ServerId};

use crate::conns::{Conn, ConnTable};
use crate::lbs::bucket_table::{BucketTable, NONE};
use crate::lbs::{LbModel, World};

pub struct Beamer {
    table: BucketTable,
    timeout: Option<Nanos>,
    daisy_chaining: bool,
    /// Batches of changed buckets waiting for their previous server to expire, oldest
    /// first (the timeout is constant, so they expire in order).
    expiries: VecDeque<(Nanos, Vec<u32>)>,
    /// `marks[bucket] == epoch` flags the buckets a scan must look at.
    marks: Vec<u32>,
    epoch: u32,
}

impl Beamer {
    pub fn new(buckets: u32, timeout: Option<Nanos>, daisy_chaining: bool) -> Self {
        let table = BucketTable::new(buckets);
        let marks = vec![0; table.len()];
        Beamer {
            table,
            timeout,
            daisy_chaining,
            expiries: VecDeque::new(),
            marks,
            epoch: 0,
        }
    }

    pub fn table(&self) -> &BucketTable {
        &self.table
    }

    /// Whether the connection's next packet still reaches its server.
    #[inline]
    fn reaches(&self, conn: &Conn) -> bool {
        let bucket = conn.aux as u32;
        let server = conn.server.0;
        server == self.table.current(bucket)
            || (self.daisy_chaining && server == self.table.previous(bucket))
    }

    fn next_epoch(&mut self) -> u32 {
        self.epoch += 1;
        self.epoch
    }

    /// Makes the table's members `target` and reports the connections that breaks.
    pub fn apply(
        &mut self,
        target: &[ServerId],
        now: Nanos,
        conns: &ConnTable,
        broken: &mut Vec<u32>,
    ) {
        self.table.sync(target, now);
        if self.table.changed().is_empty() {
            return;
        }
        let epoch = self.next_epoch();
        for &bucket in self.table.changed() {
            self.marks[bucket as usize] = epoch;
        }
        for (slot, conn) in conns.iter() {
            if self.marks[conn.aux as usize] == epoch && !self.reaches(conn) {
                broken.push(slot);
            }
        }
        if let (Some(timeout), true) = (self.timeout, self.daisy_chaining) {
            self.expiries
                .push_back((now + timeout, self.table.changed().to_vec()));
        }
    }

    fn place_in_bucket(&self, conn: &mut Conn) -> ServerId {
        let bucket = self.table.bucket(conn.flow_hash);
        conn.aux = u64::from(bucket);
        ServerId(self.table.current(bucket))
    }

    fn expire(&mut self, now: Nanos, conns: &ConnTable, broken: &mut Vec<u32>) {
        let timeout = self.timeout.unwrap_or(0);
        let epoch = self.next_epoch();
        let mut any = false;
        while let Some((at, _)) = self.expiries.front() {
            if *at > now {
                break;
            }
            let (at, buckets) = self.expiries.pop_front().expect("front exists");
            for bucket in buckets {
                // A bucket changed again since has a newer previous server and its own batch.
                if self.table.changed_at(bucket) + timeout == at
                    && self.table.previous(bucket) != NONE
                {
                    self.marks[bucket as usize] = epoch;
                    any = true;
                }
            }
        }
        if !any {
            return;
        }
        for (slot, conn) in conns.iter() {
            let bucket = conn.aux as u32;
            if self.marks[bucket as usize] == epoch
                && conn.server.0 == self.table.previous(bucket)
                && conn.server.0 != self.table.current(bucket)
            {
                broken.push(slot);
            }
        }
        for bucket in 0..self.marks.len() {
            if self.marks[bucket] == epoch {
                self.table.clear_previous(bucket as u32);
            }
        }
    }
}

impl LbModel for Beamer {
    fn start(&mut self, world: &World) {
        self.table.sync(world.pool, world.now);
    }

    fn place(&mut self, _world: &World, _rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        self.place_in_bucket(conn)
    }

    fn pool_changed(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.apply(world.pool, world.now, conns, broken);
    }

    fn next_timer(&self) -> Option<Nanos> {
        self.expiries.front().map(|(at, _)| *at)
    }

    fn timer(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.expire(world.now, conns, broken);
    }
}

/// Beamer whose controller takes servers above `(1 + threshold) x average` out of the
/// table and puts them back once they are below the average.
pub struct DynamicBeamer {
    beamer: Beamer,
    threshold: f64,
    check_interval: Nanos,
    /// Pool servers currently kept out of the table for overload, sorted.
    excluded: Vec<ServerId>,
    target: Vec<ServerId>,
}

impl DynamicBeamer {
    pub fn new(
        buckets: u32,
        timeout: Option<Nanos>,
        threshold: f64,
        check_interval: Nanos,
    ) -> Self {
        DynamicBeamer {
            beamer: Beamer::new(buckets, timeout, true),
            threshold,
            check_interval: check_interval.max(1),
            excluded: Vec::new(),
            target: Vec::new(),
        }
    }

    fn sync(&mut self, world: &World, conns: &ConnTable, broken: &mut Vec<u32>) {
        self.excluded
            .retain(|id| world.pool.binary_search(id).is_ok());
        self.target.clear();
        self.target.extend(
            world
                .pool
                .iter()
                .copied()
                .filter(|id| self.excluded.binary_search(id).is_err()),
        );
        if self.target.is_empty() {
            // Never empty the table: put back the least loaded excluded server.
            let lightest = *self
                .excluded
                .iter()
                .min_by_key(|id| (world.active_of(**id), **id))
                .expect("pool not empty");
            self.excluded.retain(|&id| id != lightest);
            self.target.push(lightest);
        }
        let target = std::mem::take(&mut self.target);
        self.beamer.apply(&target, world.now, conns, broken);
        self.target = target;
    }
}

impl LbModel for DynamicBeamer {
    fn start(&mut self, world: &World) {
        self.beamer.start(world);
    }

    fn place(&mut self, _world: &World, _rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        self.beamer.place_in_bucket(conn)
    }

    fn pool_changed(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.sync(world, conns, broken);
    }

    fn tick_interval(&self) -> Option<Nanos> {
        Some(self.check_interval)
    }

    fn tick(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        let average = world.average_active();
        let limit = (1.0 + self.threshold) * average;
        let before = self.excluded.len();
        // Back in: excluded servers now below the average.
        self.excluded
            .retain(|id| f64::from(world.active_of(*id)) >= average);
        let readded = self.excluded.len() != before;
        // Out: the busiest table member above the threshold, one per check, so that the
        // buckets it sheds can settle before the next decision (taking every server above
        // the threshold at once cascades: their buckets overload the next ones).
        let busiest = self
            .beamer
            .table()
            .members()
            .iter()
            .copied()
            .filter(|id| f64::from(world.active_of(*id)) > limit)
            .max_by_key(|id| (world.active_of(*id), std::cmp::Reverse(*id)));
        if let Some(id) = busiest {
            if let Err(position) = self.excluded.binary_search(&id) {
                self.excluded.insert(position, id);
            }
        }
        if readded || busiest.is_some() {
            self.sync(world, conns, broken);
        }
    }

    fn next_timer(&self) -> Option<Nanos> {
        self.beamer.next_timer()
    }

    fn timer(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.beamer.timer(world, conns, broken);
    }
}
