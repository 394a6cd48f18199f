//! Per-worker fallback table: flow → server for connections the cookie cannot route.
//!
//! Normally the server a connection was sent to is carried statelessly in the TCP timestamp
//! echo (the "cookie"). Clients that send no TCP timestamp option (Windows, mostly) give us
//! nothing to carry it in, so for those flows alone each worker remembers the choice here.
//! Memory is bounded: when the table is full the least recently used flow is forgotten, which
//! at worst re-balances one idle connection.
//!
//! # Why hand-written and not the `lru` crate
//!
//! This table sits on the per-packet path. The `lru` crate allocates one heap node per insert
//! until it is full and keeps its index in a `HashMap` that rehashes (allocating and copying
//! every entry) as it grows, so a burst of new flows would stall a worker on the allocator.
//! [`FallbackTable`] allocates everything once in [`FallbackTable::with_capacity`]:
//!
//! * a slab of entries, each `{key, server, prev, next, hash tag}`, threaded on an intrusive
//!   doubly linked recency list (head = most recent, tail = next to evict), and a free list
//!   threaded through the same `next` links for slots given back by [`FallbackTable::remove`];
//! * an open-addressing index of `u64` buckets, a power of two and at least twice the
//!   capacity (load factor ≤ ½, so probe runs stay short and an empty bucket always exists),
//!   linear probing with backward-shift deletion (no tombstones, so the table never degrades
//!   under churn and never needs a rebuild).
//!
//! Lookup, insert, touch, remove and evict are all O(1) expected. The hash is supplied by the
//! caller: the pipeline has already computed a keyed SipHash of the flow, and hashing again
//! here would only cost cycles. Keyed matters: an attacker who cannot predict bucket
//! positions cannot build long probe runs.
//!
//! Both arrays are reserved/zeroed up front with `Vec::with_capacity` and `vec![0; n]`, which
//! the allocator serves from fresh zero pages for large sizes, so a worker's 1 Mi-entry table
//! only becomes resident as flows actually land in it.

use crate::types::ServerId;

/// Default number of flows a worker's table holds.
pub const DEFAULT_CAPACITY: usize = 1 << 20;

/// Largest accepted capacity: slot numbers and bucket positions must fit in `u32` (bucket
/// count is ≥ 2 × capacity rounded up to a power of two, and slot 0 is reserved for "empty").
pub const MAX_CAPACITY: usize = 1 << 30;

/// The flow a fallback entry is for: the canonical connection id the pipeline hashed.
pub use crate::hash::FlowKey;

/// Counters for observability. All are monotonic since construction.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FallbackStats {
    /// [`FallbackTable::lookup`] calls that found the flow.
    pub hits: u64,
    /// [`FallbackTable::lookup`] calls that did not find the flow.
    pub misses: u64,
    /// [`FallbackTable::insert`] calls that added a flow not already present.
    pub inserts: u64,
    /// [`FallbackTable::insert`] calls that overwrote the server of a present flow.
    pub updates: u64,
    /// Flows forgotten to make room for a new one (explicit removals are not counted).
    pub evictions: u64,
}

/// End-of-list marker for the recency and free lists.
const NIL: u32 = u32::MAX;

/// One remembered flow, living in a slab slot.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: FlowKey,
    server: ServerId,
    /// Low 32 bits of the caller's hash, kept so eviction can find this entry's bucket
    /// without the caller supplying the hash again.
    hash_tag: u32,
    /// Towards the most recent end; `NIL` at the head.
    prev: u32,
    /// Towards the least recent end; `NIL` at the tail. Also the free-list link.
    next: u32,
}

/// A bucket of the index packs `slot + 1` in the high half (0 = empty, so a zeroed array is an
/// empty index) and the low 32 bits of the flow hash in the low half. The hash tag both gives
/// the bucket's home position (`tag & mask`) for backward-shift deletion and filters out most
/// non-matching buckets without touching the entry slab.
type Bucket = u64;
const EMPTY_BUCKET: Bucket = 0;

#[inline]
fn pack_bucket(slot: u32, hash_tag: u32) -> Bucket {
    (u64::from(slot + 1) << 32) | u64::from(hash_tag)
}

#[inline]
fn bucket_hash_tag(bucket: Bucket) -> u32 {
    bucket as u32
}

/// Slab slot a non-empty bucket points to.
#[inline]
fn bucket_slot(bucket: Bucket) -> u32 {
    ((bucket >> 32) as u32) - 1
}

/// Fixed-capacity LRU map from [`FlowKey`] to [`ServerId`]; see the module docs.
///
/// The caller must pass the same `hash` for the same key every time (any good 64-bit hash of
/// the key; only its low 32 bits are used). A different hash for the same key is not unsafe,
/// it just makes the key unfindable until it ages out.
pub struct FallbackTable {
    entries: Vec<Entry>,
    buckets: Vec<Bucket>,
    /// `buckets.len() - 1`; bucket count is a power of two.
    bucket_mask: usize,
    capacity: usize,
    len: usize,
    /// Most recently used entry, or `NIL`.
    head: u32,
    /// Least recently used entry (next to evict), or `NIL`.
    tail: u32,
    /// Slots freed by `remove`, linked through `Entry::next`; slots past `entries.len()` are
    /// handed out by pushing, which never reallocates because the capacity is reserved.
    free: u32,
    stats: FallbackStats,
}

impl Default for FallbackTable {
    /// A table of [`DEFAULT_CAPACITY`] flows.
    fn default() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }
}

impl FallbackTable {
    /// Allocates a table for `capacity` flows. This is the only allocation the table ever
    /// makes.
    ///
    /// # Panics
    /// If `capacity` is 0 or above [`MAX_CAPACITY`]; both are configuration errors.
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(
            (1..=MAX_CAPACITY).contains(&capacity),
            "fallback table capacity must be in 1..={MAX_CAPACITY}, got {capacity}"
        );
        let bucket_count = (capacity * 2).next_power_of_two();
        FallbackTable {
            entries: Vec::with_capacity(capacity),
            buckets: vec![EMPTY_BUCKET; bucket_count],
            bucket_mask: bucket_count - 1,
            capacity,
            len: 0,
            head: NIL,
            tail: NIL,
            free: NIL,
            stats: FallbackStats::default(),
        }
    }

    /// Number of flows remembered.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of flows the table holds before it starts evicting.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn stats(&self) -> FallbackStats {
        self.stats
    }

    /// The server remembered for `key`, marking the flow most recently used. Counts a hit or
    /// a miss.
    pub fn lookup(&mut self, key: &FlowKey, hash: u64) -> Option<ServerId> {
        match self.find(key, hash) {
            Some((_, slot)) => {
                self.stats.hits += 1;
                self.move_to_front(slot);
                Some(self.entries[slot as usize].server)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The server remembered for `key` without touching recency or counters (for diagnostics
    /// and tests; the packet path uses [`lookup`](Self::lookup)).
    pub fn peek(&self, key: &FlowKey, hash: u64) -> Option<ServerId> {
        self.find(key, hash)
            .map(|(_, slot)| self.entries[slot as usize].server)
    }

    /// Remembers `server` for `key` as the most recently used flow. Overwrites the server if
    /// the flow is present; otherwise, if the table is full, first forgets the least recently
    /// used flow.
    pub fn insert(&mut self, key: FlowKey, hash: u64, server: ServerId) {
        if let Some((_, slot)) = self.find(&key, hash) {
            self.stats.updates += 1;
            self.entries[slot as usize].server = server;
            self.move_to_front(slot);
            return;
        }
        self.stats.inserts += 1;
        let hash_tag = hash as u32;
        let entry = Entry {
            key,
            server,
            hash_tag,
            prev: NIL,
            next: NIL,
        };
        let slot = if self.len == self.capacity {
            self.stats.evictions += 1;
            let victim = self.tail;
            self.unindex(victim);
            self.unlink(victim);
            self.entries[victim as usize] = entry;
            victim
        } else {
            self.len += 1;
            if self.free != NIL {
                let slot = self.free;
                self.free = self.entries[slot as usize].next;
                self.entries[slot as usize] = entry;
                slot
            } else {
                debug_assert!(self.entries.len() < self.entries.capacity());
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        self.push_front(slot);
        self.index(slot, hash_tag);
    }

    /// Forgets `key`, returning the server it had.
    pub fn remove(&mut self, key: &FlowKey, hash: u64) -> Option<ServerId> {
        let (bucket, slot) = self.find(key, hash)?;
        self.delete_bucket(bucket);
        self.unlink(slot);
        self.entries[slot as usize].next = self.free;
        self.free = slot;
        self.len -= 1;
        Some(self.entries[slot as usize].server)
    }

    /// Bucket position and slab slot of `key`, if present.
    fn find(&self, key: &FlowKey, hash: u64) -> Option<(usize, u32)> {
        let hash_tag = hash as u32;
        let mut pos = hash_tag as usize & self.bucket_mask;
        loop {
            let bucket = self.buckets[pos];
            if bucket == EMPTY_BUCKET {
                return None;
            }
            if bucket_hash_tag(bucket) == hash_tag {
                let slot = bucket_slot(bucket);
                if self.entries[slot as usize].key == *key {
                    return Some((pos, slot));
                }
            }
            pos = (pos + 1) & self.bucket_mask;
        }
    }

    /// Adds a bucket for `slot`, whose key is known to be absent from the index.
    fn index(&mut self, slot: u32, hash_tag: u32) {
        let mut pos = hash_tag as usize & self.bucket_mask;
        while self.buckets[pos] != EMPTY_BUCKET {
            pos = (pos + 1) & self.bucket_mask;
        }
        self.buckets[pos] = pack_bucket(slot, hash_tag);
    }

    /// Removes the bucket pointing at `slot` (used on eviction, where only the slot is known).
    fn unindex(&mut self, slot: u32) {
        let hash_tag = self.entries[slot as usize].hash_tag;
        let wanted = pack_bucket(slot, hash_tag);
        let mut pos = hash_tag as usize & self.bucket_mask;
        while self.buckets[pos] != wanted {
            debug_assert_ne!(
                self.buckets[pos], EMPTY_BUCKET,
                "live entry missing from index"
            );
            pos = (pos + 1) & self.bucket_mask;
        }
        self.delete_bucket(pos);
    }

    /// Empties bucket `hole` and shifts later buckets of the same probe run back so every
    /// remaining key stays reachable from its home without tombstones.
    fn delete_bucket(&mut self, mut hole: usize) {
        let mask = self.bucket_mask;
        let mut pos = hole;
        loop {
            pos = (pos + 1) & mask;
            let bucket = self.buckets[pos];
            if bucket == EMPTY_BUCKET {
                break;
            }
            let home = bucket_hash_tag(bucket) as usize & mask;
            // The bucket may fill the hole only if the hole lies on its probe path, i.e. its
            // home is at or before the hole (cyclically): distance home→pos ≥ distance hole→pos.
            if (pos.wrapping_sub(home) & mask) >= (pos.wrapping_sub(hole) & mask) {
                self.buckets[hole] = bucket;
                hole = pos;
            }
        }
        self.buckets[hole] = EMPTY_BUCKET;
    }

    fn move_to_front(&mut self, slot: u32) {
        if self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    fn push_front(&mut self, slot: u32) {
        let old_head = self.head;
        {
            let entry = &mut self.entries[slot as usize];
            entry.prev = NIL;
            entry.next = old_head;
        }
        if old_head != NIL {
            self.entries[old_head as usize].prev = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
    }

    fn unlink(&mut self, slot: u32) {
        let Entry { prev, next, .. } = self.entries[slot as usize];
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    /// Keys from most to least recently used.
    #[cfg(test)]
    fn keys_by_recency(&self) -> Vec<FlowKey> {
        let mut keys = Vec::with_capacity(self.len);
        let mut slot = self.head;
        while slot != NIL {
            keys.push(self.entries[slot as usize].key);
            slot = self.entries[slot as usize].next;
        }
        keys
    }

    /// Checks every structural invariant; tests call it after each operation.
    #[cfg(test)]
    fn assert_consistent(&self) {
        assert!(self.len <= self.capacity);
        assert!(self.entries.capacity() >= self.capacity);
        assert!(
            self.entries.len() <= self.capacity,
            "slab grew past its reservation"
        );
        // Recency list: walkable both ways, `len` long.
        let forward = self.keys_by_recency();
        assert_eq!(forward.len(), self.len);
        let mut backward = 0;
        let mut slot = self.tail;
        let mut after = NIL;
        while slot != NIL {
            assert_eq!(self.entries[slot as usize].next, after);
            after = slot;
            slot = self.entries[slot as usize].prev;
            backward += 1;
        }
        assert_eq!(backward, self.len);
        assert_eq!(after, self.head);
        // Index: exactly one bucket per live entry, each reachable from its home with no
        // empty bucket in between, and no key indexed twice.
        let occupied: Vec<usize> = (0..self.buckets.len())
            .filter(|&pos| self.buckets[pos] != EMPTY_BUCKET)
            .collect();
        assert_eq!(occupied.len(), self.len);
        let mut seen = std::collections::HashSet::new();
        for pos in occupied {
            let bucket = self.buckets[pos];
            let entry = &self.entries[bucket_slot(bucket) as usize];
            assert_eq!(entry.hash_tag, bucket_hash_tag(bucket));
            assert!(seen.insert(entry.key), "key indexed twice");
            let mut probe = entry.hash_tag as usize & self.bucket_mask;
            while probe != pos {
                assert_ne!(self.buckets[probe], EMPTY_BUCKET, "gap on probe path");
                probe = (probe + 1) & self.bucket_mask;
            }
        }
        assert_eq!(seen, forward.into_iter().collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u16) -> FlowKey {
        FlowKey {
            client_ip: 0x0a00_0000 | u32::from(n),
            client_port: 40_000 + n,
            vip_ip: 0xc0a8_0001,
            vip_port: 443,
            protocol: 6,
        }
    }

    /// A well-mixed test hash (splitmix64 finalizer over the port).
    fn good_hash(key: &FlowKey) -> u64 {
        let mut z = u64::from(key.client_port).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn server(n: u16) -> ServerId {
        ServerId(n)
    }

    #[test]
    fn lookup_finds_what_insert_stored() {
        let mut table = FallbackTable::with_capacity(8);
        assert!(table.is_empty());
        for n in 0..8 {
            table.insert(key(n), good_hash(&key(n)), server(n + 100));
            table.assert_consistent();
        }
        assert_eq!(table.len(), 8);
        for n in 0..8 {
            assert_eq!(
                table.lookup(&key(n), good_hash(&key(n))),
                Some(server(n + 100))
            );
        }
        assert_eq!(table.lookup(&key(99), good_hash(&key(99))), None);
        table.assert_consistent();
    }

    #[test]
    fn insert_of_present_key_updates_without_growing() {
        let mut table = FallbackTable::with_capacity(4);
        table.insert(key(1), good_hash(&key(1)), server(1));
        table.insert(key(1), good_hash(&key(1)), server(2));
        assert_eq!(table.len(), 1);
        assert_eq!(table.peek(&key(1), good_hash(&key(1))), Some(server(2)));
        let stats = table.stats();
        assert_eq!((stats.inserts, stats.updates), (1, 1));
        table.assert_consistent();
    }

    #[test]
    fn full_table_evicts_least_recently_used_first() {
        let mut table = FallbackTable::with_capacity(3);
        for n in 1..=3 {
            table.insert(key(n), good_hash(&key(n)), server(n));
        }
        // Touch 1, so 2 becomes least recent, then 3.
        assert_eq!(table.lookup(&key(1), good_hash(&key(1))), Some(server(1)));
        assert_eq!(table.keys_by_recency(), vec![key(1), key(3), key(2)]);

        table.insert(key(4), good_hash(&key(4)), server(4));
        assert_eq!(table.peek(&key(2), good_hash(&key(2))), None);
        assert_eq!(table.keys_by_recency(), vec![key(4), key(1), key(3)]);

        // An update also counts as use: 3 survives, 1 goes.
        table.insert(key(3), good_hash(&key(3)), server(33));
        table.insert(key(5), good_hash(&key(5)), server(5));
        assert_eq!(table.keys_by_recency(), vec![key(5), key(3), key(4)]);
        assert_eq!(table.peek(&key(1), good_hash(&key(1))), None);
        assert_eq!(table.stats().evictions, 2);
        table.assert_consistent();
    }

    #[test]
    fn peek_does_not_change_recency_or_counters() {
        let mut table = FallbackTable::with_capacity(2);
        table.insert(key(1), good_hash(&key(1)), server(1));
        table.insert(key(2), good_hash(&key(2)), server(2));
        assert_eq!(table.peek(&key(1), good_hash(&key(1))), Some(server(1)));
        table.insert(key(3), good_hash(&key(3)), server(3));
        assert_eq!(table.peek(&key(1), good_hash(&key(1))), None);
        let stats = table.stats();
        assert_eq!((stats.hits, stats.misses), (0, 0));
    }

    #[test]
    fn counters_track_hits_misses_inserts_updates_evictions() {
        let mut table = FallbackTable::with_capacity(2);
        let h = |n| good_hash(&key(n));
        table.insert(key(1), h(1), server(1)); // insert
        table.insert(key(2), h(2), server(2)); // insert
        table.insert(key(2), h(2), server(3)); // update
        table.lookup(&key(1), h(1)); // hit
        table.lookup(&key(7), h(7)); // miss
        table.insert(key(3), h(3), server(3)); // insert + eviction of 2
        table.lookup(&key(2), h(2)); // miss
        table.remove(&key(1), h(1)); // not an eviction
        assert_eq!(
            table.stats(),
            FallbackStats {
                hits: 1,
                misses: 2,
                inserts: 3,
                updates: 1,
                evictions: 1,
            }
        );
    }

    #[test]
    fn capacity_one_keeps_only_the_latest_flow() {
        let mut table = FallbackTable::with_capacity(1);
        for n in 0..10 {
            table.insert(key(n), good_hash(&key(n)), server(n));
            table.assert_consistent();
            assert_eq!(table.len(), 1);
            assert_eq!(table.peek(&key(n), good_hash(&key(n))), Some(server(n)));
            if n > 0 {
                assert_eq!(table.peek(&key(n - 1), good_hash(&key(n - 1))), None);
            }
        }
        assert_eq!(table.stats().evictions, 9);
        assert_eq!(table.remove(&key(9), good_hash(&key(9))), Some(server(9)));
        assert!(table.is_empty());
        table.insert(key(3), good_hash(&key(3)), server(3));
        assert_eq!(table.lookup(&key(3), good_hash(&key(3))), Some(server(3)));
        table.assert_consistent();
    }

    #[test]
    fn removed_slots_are_reused_without_growing_the_slab() {
        let mut table = FallbackTable::with_capacity(4);
        for round in 0..50u16 {
            for n in 0..4 {
                let k = key(round * 4 + n);
                table.insert(k, good_hash(&k), server(n));
            }
            for n in 0..4 {
                let k = key(round * 4 + n);
                assert_eq!(table.remove(&k, good_hash(&k)), Some(server(n)));
            }
            assert!(table.is_empty());
            table.assert_consistent();
        }
        assert_eq!(table.stats().evictions, 0);
        assert_eq!(table.remove(&key(0), good_hash(&key(0))), None);
    }

    #[test]
    fn all_keys_colliding_on_one_hash_still_work() {
        // Worst case for the index: one probe run holding everything, with deletions from
        // its middle exercising backward shift across equal homes.
        let mut table = FallbackTable::with_capacity(16);
        for n in 0..16 {
            table.insert(key(n), 0xdead_beef, server(n));
        }
        for n in (0..16).step_by(3) {
            assert_eq!(table.remove(&key(n), 0xdead_beef), Some(server(n)));
            table.assert_consistent();
        }
        for n in 0..16 {
            let expected = (n % 3 != 0).then_some(server(n));
            assert_eq!(table.peek(&key(n), 0xdead_beef), expected);
        }
    }

    #[test]
    fn probe_runs_wrapping_past_the_last_bucket_stay_reachable() {
        // Homes at the very end of the bucket array force runs to wrap to position 0.
        let mut table = FallbackTable::with_capacity(8);
        let last = table.bucket_mask as u64;
        for n in 0..8 {
            table.insert(key(n), last - u64::from(n % 2), server(n));
            table.assert_consistent();
        }
        for n in [0, 3, 4] {
            table.remove(&key(n), last - u64::from(n % 2));
            table.assert_consistent();
        }
        for n in [1, 2, 5, 6, 7] {
            assert_eq!(
                table.peek(&key(n), last - u64::from(n % 2)),
                Some(server(n))
            );
        }
    }

    #[test]
    fn default_table_has_default_capacity() {
        let table = FallbackTable::default();
        assert_eq!(table.capacity(), DEFAULT_CAPACITY);
        assert!(table.buckets.len() >= 2 * DEFAULT_CAPACITY);
    }

    #[test]
    #[should_panic(expected = "capacity")]
    fn zero_capacity_is_refused() {
        let _ = FallbackTable::with_capacity(0);
    }

    /// Obviously-correct LRU: a vector ordered most recent first.
    #[derive(Default)]
    struct ReferenceLru {
        capacity: usize,
        entries: Vec<(FlowKey, ServerId)>,
        stats: FallbackStats,
    }

    impl ReferenceLru {
        fn position(&self, key: &FlowKey) -> Option<usize> {
            self.entries.iter().position(|(k, _)| k == key)
        }

        fn lookup(&mut self, key: &FlowKey) -> Option<ServerId> {
            match self.position(key) {
                Some(i) => {
                    self.stats.hits += 1;
                    let entry = self.entries.remove(i);
                    self.entries.insert(0, entry);
                    Some(entry.1)
                }
                None => {
                    self.stats.misses += 1;
                    None
                }
            }
        }

        fn insert(&mut self, key: FlowKey, server: ServerId) {
            if let Some(i) = self.position(&key) {
                self.stats.updates += 1;
                self.entries.remove(i);
            } else {
                self.stats.inserts += 1;
                if self.entries.len() == self.capacity {
                    self.stats.evictions += 1;
                    self.entries.pop();
                }
            }
            self.entries.insert(0, (key, server));
        }

        fn remove(&mut self, key: &FlowKey) -> Option<ServerId> {
            self.position(key).map(|i| self.entries.remove(i).1)
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Lookup(u16),
        Insert(u16, u16),
        Remove(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        // A key space a few times the capacity gives a healthy mix of hits, misses and
        // evictions.
        let key_id = 0u16..24;
        prop_oneof![
            3 => key_id.clone().prop_map(Op::Lookup),
            4 => (key_id.clone(), 0..=ServerId::MAX).prop_map(|(k, s)| Op::Insert(k, s)),
            1 => key_id.prop_map(Op::Remove),
        ]
    }

    /// Runs `ops` against both implementations, comparing every answer and the full recency
    /// order after each step.
    fn check_against_reference(capacity: usize, ops: &[Op], hash: impl Fn(&FlowKey) -> u64) {
        let mut table = FallbackTable::with_capacity(capacity);
        let mut reference = ReferenceLru {
            capacity,
            ..ReferenceLru::default()
        };
        for op in ops {
            match *op {
                Op::Lookup(k) => {
                    let k = key(k);
                    assert_eq!(table.lookup(&k, hash(&k)), reference.lookup(&k), "{op:?}");
                }
                Op::Insert(k, s) => {
                    let k = key(k);
                    table.insert(k, hash(&k), server(s));
                    reference.insert(k, server(s));
                }
                Op::Remove(k) => {
                    let k = key(k);
                    assert_eq!(table.remove(&k, hash(&k)), reference.remove(&k), "{op:?}");
                }
            }
            table.assert_consistent();
            let reference_order: Vec<FlowKey> = reference.entries.iter().map(|e| e.0).collect();
            assert_eq!(table.keys_by_recency(), reference_order, "after {op:?}");
            assert_eq!(table.len(), reference.entries.len());
        }
        assert_eq!(table.stats(), reference.stats);
    }

    proptest! {
        #[test]
        fn matches_reference_lru_with_good_hash(
            capacity in 1usize..10,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            check_against_reference(capacity, &ops, good_hash);
        }

        /// A hash with only four values forces long shared probe runs and tag collisions, so
        /// correctness cannot be riding on hash quality.
        #[test]
        fn matches_reference_lru_with_colliding_hash(
            capacity in 1usize..10,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            check_against_reference(capacity, &ops, |k| u64::from(k.client_port % 4));
        }
    }
}
