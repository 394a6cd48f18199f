//! The indirection table shared by Beamer and Faild: a fixed number of buckets (Beamer's
//! buckets, Faild's ECMP next-hop entries), each mapped to a current server and, for daisy
//! chaining, the one server it was mapped to before its last change.
//!
//! Reassignment follows both papers' controllers: the buckets of a server that leaves go
//! one by one to the member with the fewest buckets (Faild: "we greedily reassign ARP
//! entries to the hosts with the fewest mapped entries"; Beamer's stable hashing moves
//! only the leaving server's buckets), and a server that joins takes buckets one by one
//! from the member with the most until it has its share. Ties go to the lowest id, so a
//! run replays exactly. A donor gives away the bucket it has held longest: a bucket that
//! just moved still daisy-chains to its previous server, and moving it again would cut
//! that chain (neither paper says which bucket its controller picks; giving away the
//! newest would break connections on every re-addition that follows a removal).
//!
//! When a bucket moves, its previous server becomes the server it had until now: whatever
//! previous server it had before is forgotten, which is how a bucket that changes twice
//! breaks the connections of its first owner.

use std::collections::VecDeque;

use cheetah_core::{Nanos, ServerId};

/// No server (a bucket with no previous server).
pub const NONE: u16 = u16::MAX;

pub struct BucketTable {
    current: Vec<u16>,
    previous: Vec<u16>,
    changed_at: Vec<Nanos>,
    /// Buckets whose current server is the id (indexed by id), longest held first.
    owned: Vec<VecDeque<u32>>,
    /// Servers in the table, sorted.
    members: Vec<ServerId>,
    /// Buckets changed by the last [`BucketTable::sync`].
    changed: Vec<u32>,
}

impl BucketTable {
    pub fn new(buckets: u32) -> Self {
        let buckets = buckets.max(1) as usize;
        BucketTable {
            current: vec![NONE; buckets],
            previous: vec![NONE; buckets],
            changed_at: vec![0; buckets],
            owned: Vec::new(),
            members: Vec::new(),
            changed: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    /// The bucket of a flow.
    #[inline]
    pub fn bucket(&self, flow_hash: u64) -> u32 {
        (flow_hash % self.current.len() as u64) as u32
    }

    #[inline]
    pub fn current(&self, bucket: u32) -> u16 {
        self.current[bucket as usize]
    }

    #[inline]
    pub fn previous(&self, bucket: u32) -> u16 {
        self.previous[bucket as usize]
    }

    #[inline]
    pub fn changed_at(&self, bucket: u32) -> Nanos {
        self.changed_at[bucket as usize]
    }

    pub fn members(&self) -> &[ServerId] {
        &self.members
    }

    /// Buckets owned by `server`.
    pub fn owned_by(&self, server: ServerId) -> usize {
        self.owned.get(server.index()).map_or(0, VecDeque::len)
    }

    /// Buckets changed by the last [`BucketTable::sync`], each once.
    pub fn changed(&self) -> &[u32] {
        &self.changed
    }

    /// Forgets the previous server of `bucket` (its daisy-chaining window is over).
    pub fn clear_previous(&mut self, bucket: u32) {
        self.previous[bucket as usize] = NONE;
    }

    /// Makes the table's members `target` (sorted): members that left give their buckets
    /// away, then newcomers take their share. Records the changed buckets.
    pub fn sync(&mut self, target: &[ServerId], now: Nanos) {
        self.changed.clear();
        if let Some(&max) = target.iter().max() {
            if self.owned.len() <= max.index() {
                self.owned.resize_with(max.index() + 1, VecDeque::new);
            }
        }
        if self.members.is_empty() {
            // First fill: bucket b to the (b mod n)-th member, every member an equal share.
            self.members = target.to_vec();
            for bucket in 0..self.current.len() {
                let server = self.members[bucket % self.members.len()];
                self.current[bucket] = server.0;
                self.owned[server.index()].push_back(bucket as u32);
            }
            return;
        }
        let leaving: Vec<ServerId> = self
            .members
            .iter()
            .copied()
            .filter(|id| target.binary_search(id).is_err())
            .collect();
        let joining: Vec<ServerId> = target
            .iter()
            .copied()
            .filter(|id| self.members.binary_search(id).is_err())
            .collect();
        for server in leaving {
            self.members.retain(|&id| id != server);
            let buckets = std::mem::take(&mut self.owned[server.index()]);
            for bucket in buckets {
                let to = self.fewest();
                self.assign(bucket, to, now);
            }
        }
        for server in joining {
            let position = self.members.binary_search(&server).unwrap_err();
            self.members.insert(position, server);
            let share = self.current.len() / self.members.len();
            while self.owned[server.index()].len() < share {
                let from = self.most();
                let bucket = self.owned[from.index()]
                    .pop_front()
                    .expect("donor has buckets");
                self.assign(bucket, server, now);
            }
        }
        self.changed.sort_unstable();
        self.changed.dedup();
    }

    fn assign(&mut self, bucket: u32, to: ServerId, now: Nanos) {
        let b = bucket as usize;
        self.previous[b] = self.current[b];
        self.current[b] = to.0;
        self.changed_at[b] = now;
        self.owned[to.index()].push_back(bucket);
        self.changed.push(bucket);
    }

    fn fewest(&self) -> ServerId {
        *self
            .members
            .iter()
            .min_by_key(|id| (self.owned[id.index()].len(), **id))
            .expect("the table keeps at least one member")
    }

    fn most(&self) -> ServerId {
        *self
            .members
            .iter()
            .max_by_key(|id| (self.owned[id.index()].len(), std::cmp::Reverse(**id)))
            .expect("the table keeps at least one member")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(range: std::ops::Range<u16>) -> Vec<ServerId> {
        range.map(ServerId).collect()
    }

    #[test]
    fn removal_moves_only_the_leaving_servers_buckets_evenly() {
        let mut table = BucketTable::new(400);
        table.sync(&ids(0..4), 0);
        assert!((0..4).all(|id| table.owned_by(ServerId(id)) == 100));
        table.sync(&[ServerId(0), ServerId(1), ServerId(3)], 7);
        assert_eq!(table.changed().len(), 100);
        for &bucket in table.changed() {
            assert_eq!(table.previous(bucket), 2);
            assert_ne!(table.current(bucket), 2);
            assert_eq!(table.changed_at(bucket), 7);
        }
        let shares: Vec<usize> = [0, 1, 3]
            .iter()
            .map(|&id| table.owned_by(ServerId(id)))
            .collect();
        assert_eq!(shares, [134, 133, 133]);
    }

    #[test]
    fn a_joining_server_takes_its_share_from_the_largest() {
        let mut table = BucketTable::new(300);
        table.sync(&ids(0..3), 0);
        table.sync(&ids(0..4), 1);
        assert_eq!(table.owned_by(ServerId(3)), 75);
        assert_eq!(table.changed().len(), 75);
        assert!((0..3).all(|id| table.owned_by(ServerId(id)) == 75));
    }

    #[test]
    fn a_second_change_forgets_the_first_owner() {
        let mut table = BucketTable::new(2);
        table.sync(&ids(0..2), 0);
        // Bucket 1 belongs to server 1; remove it, then remove its heir.
        table.sync(&[ServerId(0)], 1);
        assert_eq!((table.current(1), table.previous(1)), (0, 1));
        table.sync(&[ServerId(0), ServerId(5)], 2);
        let moved = table.changed()[0];
        assert_eq!(table.current(moved), 5);
        assert_eq!(table.previous(moved), 0);
    }
}
